-- Move due delayed entries back to their work stream, atomically.
-- KEYS: delayed set, work stream
-- ARGV: most entries to move
-- A member is `<op>|<length of d>|<d><c>` (see DelayedEntry in src/store/queue.rs).
-- Returns how many were moved.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local op, dlen, at = string.match(member, '^([a-z]+)|(%d+)|()')
  if op then
    local d = string.sub(member, at, at + tonumber(dlen) - 1)
    local c = string.sub(member, at + tonumber(dlen))
    if #c > 0 then
      redis.call('XADD', KEYS[2], '*', 'op', op, 'd', d, 'c', c)
    else
      redis.call('XADD', KEYS[2], '*', 'op', op, 'd', d)
    end
  else
    -- Unreadable: keep it visible to operators rather than dropping it.
    redis.call('XADD', KEYS[2], '*', 'op', 'invalid', 'd', member)
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
