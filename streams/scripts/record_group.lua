-- Record a generation's group, unless another racer's was recorded first, and
-- release every chunk parked for it, in the same step (no lost wake-ups).
-- Keys: STATE, EVENTS, PARKED (the generation's), WORK
-- Arguments: BATCH, GEN, GROUP (the group id)
-- Returns {'won', id} or {'lost', kept id}; run again with the same group id
-- (a request resent after a dropped connection), it answers 'won' again and
-- changes nothing. Or {'cancelled'}: the batch was cancelled, nothing is
-- recorded, the parked chunks are dropped, and the caller deletes its group.
-- Or {'failed'}: the generation's creation was given up meanwhile
-- (fail_generation.lua released its chunks as given up): nothing is
-- recorded, and the caller deletes its group.
local gen, group = tonumber(GEN), GROUP
local f = redis.call('HMGET', STATE, 'g:' .. gen .. ':group', 'cancelled', 'g:' .. gen .. ':failed')
local kept = f[1]
if kept == group then
  return reply({'won', group})
end
if kept then
  return reply({'lost', kept})
end
if f[2] then
  redis.call('DEL', PARKED)
  return reply({'cancelled'})
end
if f[3] then
  return reply({'failed'})
end
emit('group/' .. gen, 'group_created', cmsgpack.pack({gen = gen, group_id = group}))
put('g:' .. gen .. ':group', group)
release_parked(PARKED, WORK, gen, group)
flush()
return reply({'won', group})
