-- Record a chunk refused before it could be accepted (it does not validate:
-- bad numbers, too large, ...). Its seq becomes a hole the batch can end
-- without (see settle.lua), unless a corrected copy is accepted later.
-- Keys and arguments: settle.lua's, then SEQ, DIGEST, REASON,
-- FLAGGED_LAST (0|1): the chunk's `last`
--       flag, when it could be read (see reject() in settle.lua)
-- Returns {'rejected'} or {'refused', why} (the batch has ended: nothing is
-- recorded)
local seq, digest, reason, flagged_last = tonumber(SEQ), DIGEST, REASON, FLAGGED_LAST == '1'
local f = redis.call('HMGET', STATE, 'report', 'closed', 'seqs', 'holes', 'rejected', 'cancelled')
if f[1] then
  return reply({'refused', 'batch ' .. BATCH .. ' was already reported (' .. f[1] .. '): it takes no more chunks'})
end
if f[6] then
  return reply({'refused', 'batch ' .. BATCH .. ' was cancelled (' .. f[6] .. '): it takes no more chunks'})
end
if f[2] then
  return reply({'refused', 'batch ' .. BATCH .. ' was closed (' .. f[2] .. '): it takes no more chunks'})
end
if tombstoned(not f[3] and not f[4] and not f[5]) then
  return reply({'refused', 'batch ' .. BATCH .. ' was already reported (its events have expired): it takes no more chunks'})
end
reject(seq, digest, reason, true, flagged_last)
return reply({'rejected'})
