-- Take or renew the watchdog scanner's lease (a key with a TTL): a crashed
-- holder's lease simply expires and another worker takes over.
-- Keys: LEASE
-- Arguments: HOLDER (the worker's consumer name), TTL in ms
-- Returns 1 when HOLDER holds the lease afterwards, else 0.
local holder = redis.call('GET', LEASE)
if holder == HOLDER then
  redis.call('PEXPIRE', LEASE, TTL)
  return 1
end
if not holder then
  redis.call('SET', LEASE, HOLDER, 'PX', TTL)
  return 1
end
return 0
