-- Replace a batch's state with one rebuilt from its events, only if no event
-- was appended since the rebuild read them: every append updates the state
-- in the same script, so checking the stream's last entry id here makes the
-- rebuild atomic with respect to running workers (a replay never drops an
-- idempotency key or a count that a live append just wrote).
-- Keys: STATE, EVENTS
-- Arguments: READ_UP_TO, the last event id the rebuild read ('' for none), then field/value pairs
-- Returns 1 when replaced, 0 when events were appended meanwhile (read again).
local last = redis.call('XREVRANGE', EVENTS, '+', '-', 'COUNT', 1)
local id = ''
if last[1] then
  id = last[1][1]
end
if id ~= READ_UP_TO then
  return 0
end
local ttl = redis.call('PTTL', STATE)
-- The fields not derived from events (projection::LIVE_ONLY) are kept:
-- `alive`, a heartbeat without an event, `dlen` and `dstamp`, the number
-- log's length and last stamp, and
-- what note.lua records (`after_end`, `creds_refused`).
local LIVE_ONLY = {'alive', 'dlen', 'dstamp', 'after_end', 'creds_refused'}
local live = redis.call('HMGET', STATE, unpack(LIVE_ONLY))
redis.call('DEL', STATE)
-- In slices: Lua's unpack has a limit on how many values it returns.
local n = #ARGV
local i = 2
while i <= n do
  local j = math.min(i + 1999, n)
  redis.call('HSET', STATE, unpack(ARGV, i, j))
  i = j + 1
end
for k, name in ipairs(LIVE_ONLY) do
  if live[k] then
    redis.call('HSET', STATE, name, live[k])
  end
end
if ttl > 0 and redis.call('EXISTS', STATE) == 1 then
  redis.call('PEXPIRE', STATE, ttl)
end
return 1
