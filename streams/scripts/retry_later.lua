-- Schedule a work entry to come back after a delay, and acknowledge the
-- delivery that failed, in one step (nothing lost in between).
-- KEYS: delayed set, source stream, and optionally a batch's state hash
-- ARGV: consumer group, entry id, delay ms, delayed entry, and with the
--       state hash: `now` or `due`
-- With the state hash, the batch's `alive` field (a heartbeat without an
-- event: a poll, a limiter or durability wait) is stamped with the server's
-- clock (`due`: with the due time, for a send held until then), unless the
-- batch has reported or its state is gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], due, ARGV[4])
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 and redis.call('HEXISTS', KEYS[3], 'report') == 0 then
  redis.call('HSET', KEYS[3], 'alive', ARGV[5] == 'due' and due or now)
end
return due
