-- Schedule a work entry to come back after a delay, and acknowledge the
-- delivery that failed, in one step (nothing lost in between).
-- KEYS: delayed set, source stream, and optionally a batch's state hash
-- ARGV: consumer group, entry id, delay ms, delayed entry, and with the
--       state hash: `now`, `due` or `-` (no heartbeat), then optionally a
--       load's seq, gen and group id
-- With `now` or `due`, the batch's `alive` field (a heartbeat without an
-- event: a poll, a limiter or durability wait) is stamped with the server's
-- clock (`due`: with the due time, for a send held until then), unless the
-- batch has reported or its state is gone.
-- With a load's seq, gen and group id: the retry of a load, which relies on
-- the chunk being assigned to that generation and that generation having
-- that group. A restart from disk under `everysec` can lose both after the
-- load read them; acknowledging the delivery then would leave a chunk the
-- batch no longer counts with nothing to bring it back. So when they no
-- longer hold, nothing is written or acknowledged (returns -1): the delivery
-- stays pending and comes back (an ingest entry's chunk is accepted again;
-- a load item finds its load stale and is dropped).
if ARGV[6] then
  local f = redis.call('HMGET', KEYS[3], 's:' .. ARGV[6], 'g:' .. ARGV[7] .. ':group')
  if not f[1] or string.match(f[1], '^(%d+)|') ~= ARGV[7] or f[2] ~= ARGV[8] then
    return -1
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], due, ARGV[4])
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
if KEYS[3] and ARGV[5] ~= '-' and redis.call('EXISTS', KEYS[3]) == 1 and redis.call('HEXISTS', KEYS[3], 'report') == 0 then
  redis.call('HSET', KEYS[3], 'alive', ARGV[5] == 'due' and due or now)
end
return due
