-- Renew a consumer's lease on an entry it is still handling: reset its idle
-- time (JUSTID: no delivery counted), only if that consumer still owns it.
-- An entry settled meanwhile, or reclaimed by another consumer after all,
-- is left alone (XCLAIM alone would take it back from its new owner).
-- Keys: STREAM
-- Arguments: GROUP (the consumer group), CONSUMER, ENTRY (its id)
-- Returns 1 when renewed, 0 otherwise.
local p = redis.call('XPENDING', STREAM, GROUP, ENTRY, ENTRY, 1)
if p[1] and p[1][2] == CONSUMER then
  redis.call('XCLAIM', STREAM, GROUP, CONSUMER, 0, ENTRY, 'JUSTID')
  return 1
end
return 0
