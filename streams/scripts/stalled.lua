-- The guard of `batch_stalled`, run before append.lua's body (see
-- src/store/scripts.rs): the event is appended only if the batch is still
-- quiet since the heartbeat its key names and has no report, so a batch that
-- reports (or wakes up) while the watchdog scans is never marked.
-- KEYS, ARGV: as append.lua, with key `stalled/<hb>` and touch `0`
-- Returns {'reported'} or {'fresh'} here; otherwise append.lua's reply.
local f = redis.call('HMGET', STATE, 'k:' .. ARGV[2], 'report', 'hb')
if f[1] then
  return reply({'duplicate', f[1]})
end
if f[2] then
  return reply({'reported'})
end
if 'stalled/' .. tostring(f[3]) ~= ARGV[2] then
  return reply({'fresh'})
end
