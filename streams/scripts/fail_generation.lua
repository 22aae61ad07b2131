-- Record that a generation's group can never be created (the provider
-- refused the create for good, or it kept failing past `--retry-for`), so
-- that the generation, and the batch, still end. In one step:
--   * `generation_failed` (key failed/<gen>) with the operation and reason;
--   * the generation is closed (`failed`): later chunks go to a new one,
--     with a create of its own;
--   * every chunk parked for it is released as a load item without a group
--     (group_id ''): the load records it as given up, its recipients failed
--     with the reason, and the generation completes with nobody registered;
--     chunks still on their way find it failed at `park.lua` and do the same.
-- Keys and arguments: settle.lua's, then the key PARKED (the generation's
-- parked hash) and the arguments GEN, REASON
-- Returns {'failed', released chunks} or {'duplicate'} (recorded before)
--      or {'group', id} (a group was recorded meanwhile: nothing to give up)
--      or {'ended'} (the batch was reported or cancelled: nothing to record)
local gen, reason = tonumber(GEN), REASON
local gk = 'g:' .. gen .. ':'
local f = redis.call('HMGET', STATE, 'k:failed/' .. gen, gk .. 'group', 'report', 'cancelled')
if f[1] then
  return reply({'duplicate'})
end
if f[2] then
  return reply({'group', f[2]})
end
if f[3] or f[4] then
  -- Recipient data has no reason to outlive the batch.
  redis.call('DEL', PARKED)
  return reply({'ended'})
end
emit('failed/' .. gen, 'generation_failed', cmsgpack.pack({gen = gen, op = 'create', reason = reason}))
put(gk .. 'failed', 'create')
local released = release_parked(PARKED, WORK, gen, '')
close_generation(gen, 'failed')
try_report()
flush()
return reply({'failed', tostring(released)})
