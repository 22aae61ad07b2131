-- Close a batch: stop waiting for seqs that never arrived. Every seq from 0
-- to the last (or, the last unknown, to the highest seen) that is neither
-- assigned nor a hole is *missing*; the current generation is closed, so
-- every generation with loaded recipients is sent and the batch reports
-- (the report counts the missing seqs). Later chunks are refused.
-- Running it again changes nothing and answers the same.
-- KEYS, ARGV[1..2]: see settle.lua
-- ARGV: 3 reason
-- Returns {'closed', missing count} or {'reported', outcome} (nothing to
-- close) or {'unknown'} (no chunk of this batch was ever recorded)
local reason = ARGV[3]
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
-- Read in pages: HMGET's arguments go through unpack(), which takes at most
-- ~8000 values ("too many results to unpack"), and a batch may have more
-- seqs than that.
local missing, PAGE = {}, 1000
for from = 0, top, PAGE do
  local to, names = math.min(top, from + PAGE - 1), {}
  for s = from, to do
    names[#names + 1] = 's:' .. s
    names[#names + 1] = 'r:' .. s
  end
  local got = redis.call('HMGET', STATE, unpack(names))
  for s = from, to do
    local k = 2 * (s - from)
    if not got[k + 1] and got[k + 2] ~= '1' then
      missing[#missing + 1] = s
    end
  end
end
emit('closed', 'batch_closed', cmsgpack.pack({reason = reason, missing = missing}))
put('closed', reason)
put('missing', #missing)
settle('closed')
flush()
return reply({'closed', tostring(#missing)})
