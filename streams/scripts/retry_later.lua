-- Schedule a work entry to come back after a delay, and acknowledge the
-- delivery that failed, in one step (nothing lost in between).
-- KEYS: delayed set, source stream
-- ARGV: consumer group, entry id, delay ms, delayed entry
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], due, ARGV[4])
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
return due
