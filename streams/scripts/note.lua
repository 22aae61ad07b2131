-- Notes a fact about a batch on its state, without an event, for `status`
-- and the board: fields that no event defines (projection::LIVE_ONLY, kept
-- by a rebuild, ignored by a comparison with a replay). Only on a batch
-- whose state exists: a batch past its retention must not get a state back
-- (it would have no TTL).
-- Keys: STATE, the batch's
-- MODE 'ended': counts one more on FIELD if the batch has ended
--         (reported, cancelled or closed); returns the new count, or 0
--         (no state, or not ended).
-- MODE 'set': sets FIELD to VALUE if the state exists;
--         returns 1, or 0 (no state).

if MODE == 'ended' then
  local f = redis.call('HMGET', STATE, 'report', 'cancelled', 'closed')
  if not (f[1] or f[2] or f[3]) then
    return 0
  end
  return redis.call('HINCRBY', STATE, FIELD, 1)
end
if redis.call('EXISTS', STATE) == 0 then
  return 0
end
redis.call('HSET', STATE, FIELD, VALUE)
return 1
