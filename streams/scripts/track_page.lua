-- Records one page of a sent group's message list, read by delivery
-- tracking (src/worker/ops/track_delivery.rs): the outcome of every message
-- on it that was not delivered, one field per number in the batch's results
-- hash, and the page's counts in its delivery hash. Both are overwrites, so
-- a page read twice (a pass repeated after a crash, a page read again while
-- some of its messages had no result yet) records what it says now, once.
-- Keys: STATE, EVENTS, RESULTS, DELIVERY
-- Arguments: BATCH, GEN, GROUP (its id), PAGE (its `startKey`; '' for the first),
--       COUNTS `<delivered>|<failed>|<unknown>|<code>=<n>,...`, TTL, how long
--       both hashes live at least (s: what is left of the delivery window,
--       plus `--results-retention`; delivered.lua sets it again at the end),
--       REASONS (k), then k pairs (code, the provider's text for it: kept once per
--       batch as `reason:<code>`), then pairs (number, outcome: see
--       src/results.rs `Record::encode`)
-- Returns {'recorded'} or {'delivered'} (the generation's results are
-- counted already: nothing is written)
local gen = GEN
if redis.call('HGET', STATE, 'k:delivered/' .. gen) then
  return {'delivered'}
end
-- A message's result, once final, stays final: a page's count of final
-- messages only grows. A reader that saw the page earlier (two workers on
-- one item after a reclaim) must not put an older, smaller count back.
local function finals(counts)
  local d, f, u = string.match(counts or '', '^(%d+)|(%d+)|(%d+)|')
  return d and (tonumber(d) + tonumber(f) + tonumber(u)) or -1
end
local field = gen .. '|' .. PAGE
if finals(COUNTS) >= finals(redis.call('HGET', DELIVERY, field)) then
  redis.call('HSET', DELIVERY, field, COUNTS)
end
redis.call('HSET', DELIVERY, gen .. '|group', GROUP)
local k = tonumber(REASONS)
for i = 8, 7 + 2 * k, 2 do
  redis.call('HSET', DELIVERY, 'reason:' .. ARGV[i], ARGV[i + 1])
end
if #ARGV > 7 + 2 * k then
  redis.call('HSET', RESULTS, unpack(ARGV, 8 + 2 * k))
end
local ttl = tonumber(TTL)
if ttl > 0 then
  redis.call('EXPIRE', RESULTS, ttl)
  redis.call('EXPIRE', DELIVERY, ttl)
end
return {'recorded'}
