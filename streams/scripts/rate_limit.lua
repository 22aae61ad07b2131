-- Reserve provider requests from the shared rate limiter (GCRA). The caller
-- waits the returned number of milliseconds and then goes: one round trip per
-- request, no retry loop.
-- KEYS: limiter key
-- ARGV: requests per second, burst, cost (requests)
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = 1000000 / rate
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval * cost
local wait = new_tat - burst * interval - now
if wait < 0 then
  wait = 0
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
return math.ceil(wait / 1000)
