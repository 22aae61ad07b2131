-- The provider answered 429: learn (or lower) the request rate every worker
-- keeps to under `--rate-limit auto` (see src/worker/limiter.rs).
-- Until the first 429 there is no learned rate and requests go unpaced; the
-- first sets ARGV[1]; each later one halves it (not below ARGV[2]), but at
-- most once per ARGV[4] ms: the 429s of requests already in flight when the
-- rate was lowered say nothing about the new rate. The rate is forgotten
-- ARGV[3] ms after the last 429 that lowered it, and requests go unpaced
-- again until the provider pushes back anew.
-- KEYS: the learned rate (a hash: rate, at)
-- ARGV: first rate, lowest rate, how long it is kept (ms), the least time
--       between two lowerings (ms)
-- Returns the rate now learned (requests per second).
local rate = tonumber(redis.call('HGET', KEYS[1], 'rate'))
local at = tonumber(redis.call('HGET', KEYS[1], 'at'))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if rate and at and now - at < tonumber(ARGV[4]) then
  return rate
end
local learned = tonumber(ARGV[1])
if rate then
  learned = math.max(tonumber(ARGV[2]), math.floor(rate / 2))
end
redis.call('HSET', KEYS[1], 'rate', learned, 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return learned
