-- Renew a consumer's lease on an entry it is still handling: reset its idle
-- time (JUSTID: no delivery counted), only if that consumer still owns it.
-- An entry settled meanwhile, or reclaimed by another consumer after all,
-- is left alone (XCLAIM alone would take it back from its new owner).
-- KEYS: stream
-- ARGV: consumer group, consumer, entry id
-- Returns 1 when renewed, 0 otherwise.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p[1] and p[1][2] == ARGV[2] then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
  return 1
end
return 0
