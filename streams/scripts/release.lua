-- Give the watchdog scanner's lease up, if ARGV[1] holds it.
-- KEYS: lease key
-- ARGV: holder
-- Returns 1 when it was released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
