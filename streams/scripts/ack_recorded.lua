-- Acknowledge settled entries of a stream, each only while the last event
-- its handling appended is still recorded, in one step.
-- Keys: STREAM, then the state hashes of the batches named below
-- Arguments: GROUP (the consumer group), then per entry: its id, the index in KEYS of its
--       batch's state hash (0: no condition, the handling appended
--       nothing), the event's key and the entry id it was appended as
-- Under `appendfsync everysec` a restart from disk can take back the last
-- second of acknowledged writes. An XACK that reaches the restarted server
-- after its handling's writes were lost acknowledges an entry whose effect
-- is gone, and nothing handles it again: a parked chunk, a recorded group,
-- a loaded chunk vanish, and the batch never ends. So an entry whose event
-- is gone, or there under another entry id (appended again since), is left
-- pending: it is reclaimed after the visibility timeout and handled again
-- (every handler is idempotent). An event found here precedes this XACK in
-- the AOF, so a later loss that takes the event takes the XACK with it.
-- Returns the ids left pending.
local fields, wanted = {}, {}
local n = (#ARGV - 1) / 4
for i = 0, n - 1 do
  local s = tonumber(ARGV[3 + 4 * i])
  if s > 0 then
    fields[s] = fields[s] or {}
    wanted[s] = wanted[s] or {}
    table.insert(fields[s], 'k:' .. ARGV[4 + 4 * i])
    table.insert(wanted[s], i)
  end
end
-- One HMGET per batch (a flush usually holds entries of one or two).
local found = {}
for s, fs in pairs(fields) do
  local v = redis.call('HMGET', KEYS[s], unpack(fs))
  for j, i in ipairs(wanted[s]) do
    found[i] = v[j]
  end
end
local ack, kept = {}, {}
for i = 0, n - 1 do
  local id = ARGV[2 + 4 * i]
  if tonumber(ARGV[3 + 4 * i]) == 0 or found[i] == ARGV[5 + 4 * i] then
    table.insert(ack, id)
  else
    table.insert(kept, id)
  end
end
if #ack > 0 then
  redis.call('XACK', STREAM, GROUP, unpack(ack))
end
return kept
