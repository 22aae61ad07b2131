-- Move due delayed entries back to their lanes' work streams, atomically.
-- Keys: DELAYED (the set), NORMAL, URGENT, BULK (the lanes' work streams)
-- Arguments: MOST, the most entries to move
-- A member is `<op>|<length of d>|<d><c>`, or `<op>@<lane>|...` for a lane
-- other than normal (see DelayedEntry in src/store/queue.rs).
-- Returns how many were moved.
local lanes = {urgent = URGENT, bulk = BULK}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, tonumber(MOST))
for _, member in ipairs(due) do
  local op, lane, dlen, at = string.match(member, '^([a-z_]+)@?([a-z]*)|(%d+)|()')
  local work = lanes[lane] or NORMAL
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
    redis.call('XADD', NORMAL, '*', 'op', 'invalid', 'd', member)
  end
  redis.call('ZREM', DELAYED, member)
end
return #due
