-- Move due delayed entries back to their work stream, atomically.
-- KEYS: delayed set, work stream
-- ARGV: most entries to move
-- Returns how many were moved.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local e = cmsgpack.unpack(member)
  if e.c then
    redis.call('XADD', KEYS[2], '*', 'op', e.op, 'd', e.d, 'c', e.c)
  else
    redis.call('XADD', KEYS[2], '*', 'op', e.op, 'd', e.d)
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
