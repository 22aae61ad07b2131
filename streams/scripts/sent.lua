-- Record that a generation's group was sent (the terminal marker is the
-- event's key `send/<gen>`), and schedule the first status poll.
-- Keys: STATE, EVENTS, DELAYED
-- Arguments: BATCH, GEN, GROUP (its id), OUTCOME, POLL_DELAY ms, POLL_ENTRY
-- Returns {'recorded'} or {'duplicate'}, or {'done'}: the generation is done
-- (its send record lost with Redis's unsynced writes while its poll went
-- on): nothing recorded, no poll scheduled, nothing after the end.
local gen = tonumber(GEN)
local f = redis.call('HMGET', STATE, 'k:send/' .. gen, 'g:' .. gen .. ':done')
if f[1] then
  return reply({'duplicate'})
end
if f[2] then
  return reply({'done'})
end
emit('send/' .. gen, 'send_triggered', cmsgpack.pack({gen = gen, group_id = GROUP, outcome = OUTCOME}))
put('g:' .. gen .. ':sent', OUTCOME)
local t = redis.call('TIME')
redis.call('ZADD', DELAYED, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(POLL_DELAY), POLL_ENTRY)
flush()
return reply({'recorded'})
