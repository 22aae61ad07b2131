-- Append one event whose projection change is fixed in advance.
-- KEYS: state, events
-- ARGV: batch, key, type, data, touch (0|1), then triples (op, field, value)
--       with op `set` or `incr`
-- Returns {'appended', id} or {'duplicate', first id}
local key = ARGV[2]
local first = redis.call('HGET', STATE, 'k:' .. key)
if first then
  return reply({'duplicate', first})
end
local id = emit(key, ARGV[3], ARGV[4], ARGV[5] == '1')
for i = 6, #ARGV, 3 do
  if ARGV[i] == 'incr' then
    redis.call('HINCRBY', STATE, ARGV[i + 1], ARGV[i + 2])
  else
    put(ARGV[i + 1], ARGV[i + 2])
  end
end
flush()
return reply({'appended', id})
