-- Record that a generation's group was sent (the terminal marker is the
-- event's key `send/<gen>`), and schedule the first status poll.
-- KEYS: state, events, delayed
-- ARGV: batch, gen, group id, outcome, poll delay ms, poll entry
-- Returns {'recorded'} or {'duplicate'}
local DELAYED = KEYS[3]
local gen = tonumber(ARGV[2])
if redis.call('HEXISTS', STATE, 'k:send/' .. gen) == 1 then
  return reply({'duplicate'})
end
emit('send/' .. gen, 'send_triggered', cmsgpack.pack({gen = gen, group_id = ARGV[3], outcome = ARGV[4]}))
put('g:' .. gen .. ':sent', ARGV[4])
local t = redis.call('TIME')
redis.call('ZADD', DELAYED, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[5]), ARGV[6])
flush()
return reply({'recorded'})
