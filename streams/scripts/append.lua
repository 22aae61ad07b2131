-- Append one event whose projection change is fixed in advance.
-- Keys: STATE, EVENTS
-- Arguments: BATCH, KEY, TYPE, DATA, TOUCH (0|1), then triples (op, field, value)
--       with op `set` or `incr`
-- Returns {'appended', id} or {'duplicate', first id}
local key = KEY
local first = redis.call('HGET', STATE, 'k:' .. key)
if first then
  return reply({'duplicate', first})
end
local id = emit(key, TYPE, DATA, TOUCH == '1')
-- The triples follow the five named arguments.
for i = 6, #ARGV, 3 do
  if ARGV[i] == 'incr' then
    redis.call('HINCRBY', STATE, ARGV[i + 1], ARGV[i + 2])
  else
    put(ARGV[i + 1], ARGV[i + 2])
  end
end
flush()
return reply({'appended', id})
