-- Move an entry to the dead letters and acknowledge it, in one step.
-- KEYS: dead-letter stream, source stream
-- ARGV: consumer group, entry id, then field/value pairs of the dead letter
-- Returns the dead letter's id.
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
return id
