-- Reserve provider requests from the shared rate limiter (GCRA). The caller
-- waits the returned number of milliseconds and then goes: one round trip per
-- request, no retry loop.
-- KEYS: limiter key
-- ARGV: requests per second, burst, cost (requests), and optionally the
-- longest wait (ms) worth reserving for
-- Returns the wait in ms; a negative number -w when the wait w would be
-- longer than that: nothing was reserved, come back in w ms. (A cost too
-- large to ever fit in that wait is reserved anyway, or it would never go.)
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
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
if max_wait and wait > max_wait * 1000 and wait > (cost - burst) * interval then
  return -math.max(1, math.ceil(wait / 1000))
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
return math.ceil(wait / 1000)
