-- The provider answered 429: learn (or lower) the request rate every worker
-- keeps to under `--rate-limit auto` (see src/worker/limiter.rs).
-- Until the first 429 there is no learned rate and requests go unpaced; the
-- first sets FIRST_RATE; each later one halves it (not below LOWEST_RATE), but at
-- most once per PERIOD ms: the 429s of requests already in flight when the
-- rate was lowered say nothing about the new rate. The rate is forgotten
-- KEEP ms after the last 429 that lowered it, and requests go unpaced
-- again until the provider pushes back anew.
-- Keys: LEARNED, the learned rate (a hash: rate, at)
-- Arguments: FIRST_RATE, LOWEST_RATE, KEEP (how long it is kept, ms), PERIOD (the least time
--       between two lowerings (ms)
-- Returns the rate now learned (requests per second).
local rate = tonumber(redis.call('HGET', LEARNED, 'rate'))
local at = tonumber(redis.call('HGET', LEARNED, 'at'))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if rate and at and now - at < tonumber(PERIOD) then
  return rate
end
local learned = tonumber(FIRST_RATE)
if rate then
  learned = math.max(tonumber(LOWEST_RATE), math.floor(rate / 2))
end
redis.call('HSET', LEARNED, 'rate', learned, 'at', now)
redis.call('PEXPIRE', LEARNED, KEEP)
return learned
