-- Move due delayed entries back to their lanes' work streams, atomically.
-- KEYS: delayed set, the work streams of the normal, urgent and bulk lanes
-- ARGV: most entries to move
-- A member is `<op>|<length of d>|<d><c>`, or `<op>@<lane>|...` for a lane
-- other than normal (see DelayedEntry in src/store/queue.rs).
-- Returns how many were moved.
local lanes = {urgent = KEYS[3], bulk = KEYS[4]}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local op, lane, dlen, at = string.match(member, '^([a-z_]+)@?([a-z]*)|(%d+)|()')
  local work = lanes[lane] or KEYS[2]
  if op then
    local d = string.sub(member, at, at + tonumber(dlen) - 1)
    local c = string.sub(member, at + tonumber(dlen))
    if #c > 0 then
      redis.call('XADD', work, '*', 'op', op, 'd', d, 'c', c)
    else
      redis.call('XADD', work, '*', 'op', op, 'd', d)
    end
  else
    -- Unreadable: keep it visible to operators rather than dropping it.
    redis.call('XADD', KEYS[2], '*', 'op', 'invalid', 'd', member)
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
