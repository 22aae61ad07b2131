-- Cancel a batch: nothing more of it goes out. Every generation whose send
-- is not claimed (claim_send.lua: claimed and not given back) and that is
-- not done is stopped: closed,
-- done with status `cancelled`, and its group, if it has one, deleted at the
-- provider (a `delete` work item). A generation whose send is claimed is
-- sent (or already was) and counted, unless its claim is given back later
-- (its retry found the batch held by its schedule): then claim_send.lua
-- stops it as this script would have. The batch takes no more chunks and
-- reports `cancelled` once every generation is done: at once when no send
-- was claimed. Running it again changes nothing and answers the same.
-- A batch never seen is cancelled too, and reports at once (nothing sent):
-- its chunks are refused when they come (the report's tombstone).
-- Keys and arguments: settle.lua's, then REASON
-- Returns {'cancelled', generations stopped, unsent recipients, seen 0|1}
--      or {'reported', outcome} (it had reported: nothing to stop)
--      or {'forgotten'} (it had reported and its events expired)
local reason = REASON
local f = redis.call('HMGET', STATE, 'cancelled', 'stopped', 'unsent', 'report', 'gen', 'seqs', 'holes', 'rejected')
local seen = (f[6] or f[7] or f[8]) and '1' or '0'
if f[1] then
  return reply({'cancelled', f[2], f[3], seen})
end
if f[4] then
  return reply({'reported', f[4]})
end
if tombstoned(seen == '0') then
  return reply({'forgotten'})
end
-- Every generation, read in pages (HMGET's arguments go through unpack()).
local stopped, sending, stop, unsent = {}, {}, {}, 0
local top, PAGE, NF = tonumber(f[5]), 500, 9
if top then
  for from = 0, top, PAGE do
    local to, names = math.min(top, from + PAGE - 1), {}
    for g = from, to do
      local gk = 'g:' .. g .. ':'
      for _, name in ipairs({'k:done/' .. g, gk .. 'claimed', 'k:send/' .. g, gk .. 'closed', gk .. 'group',
        gk .. 'reg', gk .. 'c', gk .. 'n', gk .. 'back'}) do
        names[#names + 1] = name
      end
    end
    local got = redis.call('HMGET', STATE, unpack(names))
    for g = from, to do
      local k = NF * (g - from)
      if not got[k + 1] then
        if num(got[k + 2]) > num(got[k + 9]) or got[k + 3] then
          sending[#sending + 1] = g
        else
          stopped[#stopped + 1] = g
          stop[#stop + 1] = {g, got[k + 4], got[k + 5], num(got[k + 7]), num(got[k + 8])}
          unsent = unsent + num(got[k + 6])
        end
      end
    end
  end
end
emit('cancelled', 'batch_cancelled',
  cmsgpack.pack({reason = reason, stopped = stopped, sending = sending, unsent = unsent}))
put('cancelled', reason)
for _, s in ipairs(stop) do
  stop_generation(s[1], s[2], s[3], s[4], s[5])
end
flush()
-- As the fold does (an increment creates the field; a claim given back
-- after the cancel stops its generation and counts it too).
redis.call('HINCRBY', STATE, 'stopped', #stopped)
redis.call('HINCRBY', STATE, 'unsent', unsent)
if #stop > 0 then
  redis.call('HINCRBY', STATE, 'done', #stop)
  redis.call('HINCRBY', STATE, 'sent_success', 0)
  redis.call('HINCRBY', STATE, 'sent_failed', 0)
end
try_report()
return reply({'cancelled', tostring(#stopped), tostring(unsent), seen})
