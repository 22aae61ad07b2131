-- Schedule a work entry to come back after a delay, and acknowledge the
-- delivery that failed, in one step (nothing lost in between).
-- Keys: DELAYED (the set), SOURCE (the stream), and optionally a batch's STATE
-- Arguments: GROUP (the consumer group), ENTRY (its id), DELAY ms, DELAYED_ENTRY, and with the
--       state hash: ALIVE `now`, `due` or `-` (no heartbeat), then optionally a
--       load's LOAD_SEQ, LOAD_GEN and LOAD_GROUP
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
if LOAD_SEQ then
  local f = redis.call('HMGET', STATE, 's:' .. LOAD_SEQ, 'g:' .. LOAD_GEN .. ':group')
  if not f[1] or string.match(f[1], '^(%d+)|') ~= LOAD_GEN or f[2] ~= LOAD_GROUP then
    return -1
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(DELAY)
redis.call('ZADD', DELAYED, due, DELAYED_ENTRY)
redis.call('XACK', SOURCE, GROUP, ENTRY)
if STATE and ALIVE ~= '-' and redis.call('EXISTS', STATE) == 1 and redis.call('HEXISTS', STATE, 'report') == 0 then
  redis.call('HSET', STATE, 'alive', ALIVE == 'due' and due or now)
end
return due
