-- Seal a batch: declare its last seq after the fact, for a producer that
-- learns where its batch ends only after writing its last chunk (a
-- streaming job). The same as a chunk flagged `last`, without a chunk: the
-- batch takes seqs 0..last, and ends when each is assigned or a hole (at
-- once when they already are: its current generation is closed `final`,
-- and the report is decided when every generation is done).
-- A batch may be sealed before its chunks arrive (the seal and the chunks
-- travel apart, on different workers).
-- Refused, changing nothing: a seal that contradicts what the batch knows
-- (another last seq, or a higher seq already received); a seal of a batch
-- that has ended. Sealing again with the same last seq answers the same.
-- Keys and arguments: settle.lua's, then LAST (the last seq)
-- Returns {'sealed', last} or {'conflict', reason} or {'ended', reason}
local last = tonumber(LAST)
local f = redis.call('HMGET', STATE, 'last', 'max', 'rmax', 'report', 'closed', 'cancelled', 'seqs', 'holes',
  'rejected')
local known = tonumber(f[1])
if known == last then
  return reply({'sealed', LAST})
end
if f[4] then
  return reply({'ended', 'batch ' .. BATCH .. ' was already reported (' .. f[4] .. ')'})
end
if f[6] then
  return reply({'ended', 'batch ' .. BATCH .. ' was cancelled (' .. f[6] .. ')'})
end
if f[5] then
  return reply({'ended', 'batch ' .. BATCH .. ' was closed (' .. f[5] .. ')'})
end
if tombstoned(not f[7] and not f[8] and not f[9]) then
  return reply({'ended', 'batch ' .. BATCH .. ' was already reported (its events have expired)'})
end
if known then
  return reply({'conflict', 'batch ' .. BATCH .. ' already ends at seq ' .. f[1] .. ', not ' .. LAST})
end
local above = math.max(tonumber(f[2]) or -1, tonumber(f[3]) or -1)
if above > last then
  return reply({'conflict', 'seq ' .. above .. ' of batch ' .. BATCH .. ' was already received, beyond the last seq ' ..
    LAST})
end
emit('seal', 'batch_sealed', cmsgpack.pack({last = last}))
put('last', last)
-- (A batch sealed before its first chunk is watched from that chunk on, as
-- any batch: `--give-up-after` measures from what arrived.)
if settled(false, last, f[7], f[8]) then
  settle('final')
end
flush()
return reply({'sealed', LAST})
