-- Take or renew the watchdog scanner's lease (a key with a TTL): a crashed
-- holder's lease simply expires and another worker takes over.
-- KEYS: lease key
-- ARGV: holder (the worker's consumer name), TTL in ms
-- Returns 1 when ARGV[1] holds the lease afterwards, else 0.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
