-- Record that a generation's group was sent (the terminal marker is the
-- event's key `send/<gen>`), and schedule the first status poll.
-- KEYS: state, events, delayed
-- ARGV: batch, gen, group id, outcome, poll delay ms, poll entry
-- Returns {'recorded'} or {'duplicate'}, or {'done'}: the generation is done
-- (its send record lost with Redis's unsynced writes while its poll went
-- on): nothing recorded, no poll scheduled, nothing after the end.
local DELAYED = KEYS[3]
local gen = tonumber(ARGV[2])
local f = redis.call('HMGET', STATE, 'k:send/' .. gen, 'g:' .. gen .. ':done')
if f[1] then
  return reply({'duplicate'})
end
if f[2] then
  return reply({'done'})
end
emit('send/' .. gen, 'send_triggered', cmsgpack.pack({gen = gen, group_id = ARGV[3], outcome = ARGV[4]}))
put('g:' .. gen .. ':sent', ARGV[4])
local t = redis.call('TIME')
redis.call('ZADD', DELAYED, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[5]), ARGV[6])
flush()
return reply({'recorded'})
