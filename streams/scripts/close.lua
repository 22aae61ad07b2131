-- Close a batch: stop waiting for seqs that never arrived. Every seq from 0
-- to the last (or, the last unknown, to the highest seen) that is neither
-- assigned nor a hole is *missing*; the current generation is closed, so
-- every generation with loaded recipients is sent and the batch reports
-- (the report counts the missing seqs). Later chunks are refused.
-- Running it again changes nothing and answers the same.
-- Keys and arguments: settle.lua's, then REASON
-- Returns {'closed', missing count} or {'reported', outcome} (nothing to
-- close) or {'unknown'} (no chunk of this batch was ever recorded)
local reason = REASON
local f = redis.call('HMGET', STATE, 'report', 'closed', 'missing', 'last', 'max', 'rmax', 'seqs', 'holes', 'rejected')
if f[1] then
  return reply({'reported', f[1]})
end
if f[2] then
  return reply({'closed', f[3] or '0'})
end
if not f[7] and not f[8] and not f[9] then
  return reply({'unknown'})
end
local top = tonumber(f[4])
if not top then
  top = math.max(tonumber(f[5]) or -1, tonumber(f[6]) or -1)
end
-- The seqs present: assigned (`s:<seq>`) or holes (`r:<seq>`; `r:` is `0`
-- only once `s:` is set too). Read from the hash's field names, sorted, and
-- the gaps between them counted as ranges: the work is proportional to what
-- arrived, never to `top` (a producer bug can make it 4,000,000,000; a loop
-- over every seq blocked Redis for seconds, or for ever). At most
-- MAX_RANGES ranges are listed (the first), with the counts in all.
local MAX_RANGES = 100
local present = {}
for _, name in ipairs(redis.call('HKEYS', STATE)) do
  local s = tonumber(string.match(name, '^[sr]:(%d+)$'))
  if s and s <= top then
    present[#present + 1] = s
  end
end
table.sort(present)
local ranges, count, total, nxt = {}, 0, 0, 0
local function gap(from, to)
  count = count + (to - from + 1)
  total = total + 1
  if #ranges < MAX_RANGES then
    ranges[#ranges + 1] = {from, to}
  end
end
for _, s in ipairs(present) do
  if s > nxt then
    gap(nxt, s - 1)
  end
  nxt = s + 1
end
if nxt <= top then
  gap(nxt, top)
end
-- '%d', not tostring(): Lua prints numbers with '%.14g' (1e+14 and up).
local n = string.format('%d', count)
emit('closed', 'batch_closed', cmsgpack.pack({reason = reason, missing_count = count,
  missing_ranges = ranges, missing_ranges_total = total}))
put('closed', reason)
put('missing', n)
settle('closed')
flush()
return reply({'closed', n})
