-- The guard of `batch_stalled`, run before append.lua's body (see
-- src/store/scripts/mod.rs): the event is appended only if the batch is still
-- quiet since the heartbeat its key names (the later of `hb` and `alive`) and has no report, so a batch that
-- reports (or wakes up) while the watchdog scans is never marked.
-- Keys and arguments: as append.lua, with key `stalled/<hb>` and touch `0`
-- Returns {'reported'} or {'fresh'} here; otherwise append.lua's reply.
local f = redis.call('HMGET', STATE, 'k:' .. KEY, 'report', 'hb', 'alive')
if f[1] then
  return reply({'duplicate', f[1]})
end
if f[2] then
  return reply({'reported'})
end
-- The last sign of life: the later of the heartbeat and `alive` (a wait
-- that showed progress without an event).
local last = math.max(tonumber(f[3]) or 0, tonumber(f[4]) or 0)
if 'stalled/' .. string.format('%.0f', last) ~= KEY then
  return reply({'fresh'})
end
