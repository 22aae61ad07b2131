-- Notes a fact about a batch on its state, without an event, for `status`
-- and the board: fields that no event defines (projection::LIVE_ONLY, kept
-- by a rebuild, ignored by a comparison with a replay). Only on a batch
-- whose state exists: a batch past its retention must not get a state back
-- (it would have no TTL).
-- KEYS[1]: the batch's state
-- ARGV[1] 'ended': counts one more on field ARGV[2] if the batch has ended
--         (reported, cancelled or closed); returns the new count, or 0
--         (no state, or not ended).
-- ARGV[1] 'set': sets field ARGV[2] to ARGV[3] if the state exists;
--         returns 1, or 0 (no state).
local state = KEYS[1]
if ARGV[1] == 'ended' then
  local f = redis.call('HMGET', state, 'report', 'cancelled', 'closed')
  if not (f[1] or f[2] or f[3]) then
    return 0
  end
  return redis.call('HINCRBY', state, ARGV[2], 1)
end
if redis.call('EXISTS', state) == 0 then
  return 0
end
redis.call('HSET', state, ARGV[2], ARGV[3])
return 1
