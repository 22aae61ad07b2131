-- Give the watchdog scanner's lease up, if HOLDER holds it.
-- Keys: LEASE
-- Arguments: HOLDER
-- Returns 1 when it was released, else 0.
if redis.call('GET', LEASE) == HOLDER then
  return redis.call('DEL', LEASE)
end
return 0
