-- Cancel a batch: nothing more of it goes out. Every generation whose send
-- was not claimed (claim_send.lua) and that is not done is stopped: closed,
-- done with status `cancelled`, and its group, if it has one, deleted at the
-- provider (a `delete` work item). A generation whose send was claimed is
-- sent (or already was) and counted. The batch takes no more chunks and
-- reports `cancelled` once every generation is done: at once when no send
-- was claimed. Running it again changes nothing and answers the same.
-- A batch never seen is cancelled too, and reports at once (nothing sent):
-- its chunks are refused when they come (the report's tombstone).
-- KEYS, ARGV[1..2]: see settle.lua
-- ARGV: 3 reason
-- Returns {'cancelled', generations stopped, unsent recipients, seen 0|1}
--      or {'reported', outcome} (it had reported: nothing to stop)
--      or {'forgotten'} (it had reported and its events expired)
local reason = ARGV[3]
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
local top, PAGE, NF = tonumber(f[5]), 500, 8
if top then
  for from = 0, top, PAGE do
    local to, names = math.min(top, from + PAGE - 1), {}
    for g = from, to do
      local gk = 'g:' .. g .. ':'
      for _, name in ipairs({'k:done/' .. g, 'k:claim/' .. g, 'k:send/' .. g, gk .. 'closed', gk .. 'group',
        gk .. 'reg', gk .. 'c', gk .. 'n'}) do
        names[#names + 1] = name
      end
    end
    local got = redis.call('HMGET', STATE, unpack(names))
    for g = from, to do
      local k = NF * (g - from)
      if not got[k + 1] then
        if got[k + 2] or got[k + 3] then
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
put('stopped', #stopped)
put('unsent', unsent)
for _, s in ipairs(stop) do
  local g, closed, group = s[1], s[2], s[3]
  local gk = 'g:' .. g .. ':'
  if not closed then
    emit('close/' .. g, 'generation_closed', cmsgpack.pack({gen = g, reason = 'cancelled', chunks = s[4], recipients = s[5]}))
    put(gk .. 'closed', 'cancelled')
  end
  emit('done/' .. g, 'group_completed',
    cmsgpack.pack({gen = g, group_id = group or '', status = 'cancelled', sent_success = 0, sent_failed = 0}))
  put(gk .. 'done', 'cancelled')
  if group then
    redis.call('XADD', WORK, '*', 'op', 'delete', 'd', cmsgpack.pack({batch = BATCH, gen = g, group_id = group, attempt = 0}))
  end
end
flush()
if #stop > 0 then
  -- As the fold does (an increment creates the field).
  redis.call('HINCRBY', STATE, 'done', #stop)
  redis.call('HINCRBY', STATE, 'sent_success', 0)
  redis.call('HINCRBY', STATE, 'sent_failed', 0)
end
try_report()
return reply({'cancelled', tostring(#stopped), tostring(unsent), seen})
