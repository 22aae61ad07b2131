-- Move an entry to the dead letters and acknowledge it, in one step.
-- Keys: DEAD_LETTERS, SOURCE (streams), and optionally a batch's STATE
-- Arguments: GROUP (the consumer group), ENTRY (its id), then with the state
--       hash EVENT_KEY and EVENT_ID, the key and entry id of the last event the entry's handling appended, then
--       field/value pairs of the dead letter
-- With the state hash (under `everysec`), the entry is dead-lettered only
-- while that event is still recorded under that id, like
-- `ack_recorded.lua`: a rejection recorded, or a chunk given up, then lost
-- in a restart from disk before this step, would leave the batch waiting
-- for a seq nobody handles again. Otherwise nothing is written and the
-- entry stays pending (returns false).
-- Returns the dead letter's id.
local first = 3
if STATE then
  if redis.call('HGET', STATE, 'k:' .. EVENT_KEY) ~= EVENT_ID then
    return false
  end
  first = 5
end
local fields = {}
for i = first, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', DEAD_LETTERS, '*', unpack(fields))
redis.call('XACK', SOURCE, GROUP, ENTRY)
return id
