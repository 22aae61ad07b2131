-- Records one page of a sent group's message list, read by delivery
-- tracking (src/worker/ops/track_delivery.rs): the outcome of every message
-- on it that was not delivered, one field per number in the batch's results
-- hash, and the page's counts in its delivery hash. Both are overwrites, so
-- a page read twice (a pass repeated after a crash, a page read again while
-- some of its messages had no result yet) records what it says now, once.
-- KEYS: state, events, results, delivery
-- ARGV: batch, gen, group id, page (its `startKey`; '' for the first),
--       counts `<delivered>|<failed>|<unknown>|<code>=<n>,...`, how long
--       both hashes live at least (s: what is left of the delivery window,
--       plus `--results-retention`; delivered.lua sets it again at the end),
--       then pairs (number, outcome: see src/results.rs `Outcome::encode`)
-- Returns {'recorded'} or {'delivered'} (the generation's results are
-- counted already: nothing is written)
local RESULTS, DELIVERY = KEYS[3], KEYS[4]
local gen = ARGV[2]
if redis.call('HGET', STATE, 'k:delivered/' .. gen) then
  return {'delivered'}
end
redis.call('HSET', DELIVERY, gen .. '|' .. ARGV[4], ARGV[5], gen .. '|group', ARGV[3])
if #ARGV > 6 then
  redis.call('HSET', RESULTS, unpack(ARGV, 7))
end
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  redis.call('EXPIRE', RESULTS, ttl)
  redis.call('EXPIRE', DELIVERY, ttl)
end
return {'recorded'}
