-- Park a chunk whose generation has no group yet, and make sure one
-- create-group work item exists for that generation.
-- Keys: STATE, EVENTS, PARKED (the generation's), WORK
-- Arguments: BATCH, SEQ, GEN, PAYLOAD (the chunk)
-- Returns {'parked'} or {'group', id} (the group appeared meanwhile: load now)
--      or {'loaded'} (nothing to do)
--      or {'unassigned'}: the chunk is not (any more) assigned to `gen`
--         (Redis lost the assignment with its unsynced writes, under
--         `everysec`): nothing parked; the caller accepts the chunk again.
--      or {'failed'}: the generation's group can never be created
--         (fail_generation.lua): nothing parked; the caller records the
--         chunk as given up.
--      or {'ended'}: the batch was cancelled or reported: nothing parked,
--         appended or enqueued (nothing happens after the end).
local seq, gen = SEQ, GEN
local f = redis.call('HMGET', STATE, 'g:' .. gen .. ':group', 'k:park/' .. seq, 'k:create/' .. gen,
  'k:loaded/' .. gen .. '/' .. seq, 's:' .. seq, 'g:' .. gen .. ':failed', 'cancelled', 'report')
if not f[5] or string.match(f[5], '^(%d+)|') ~= gen then
  return reply({'unassigned'})
end
if f[7] or f[8] then
  return reply({'ended'})
end
if f[1] then
  return reply({'group', f[1]})
end
if f[4] then
  return reply({'loaded'})
end
if f[6] then
  return reply({'failed'})
end
redis.call('HSET', PARKED, seq, PAYLOAD)
if not f[2] then
  emit('park/' .. seq, 'chunk_parked', cmsgpack.pack({seq = tonumber(seq), gen = tonumber(gen)}))
end
if not f[3] then
  emit('create/' .. gen, 'group_requested', cmsgpack.pack({gen = tonumber(gen)}))
  redis.call('XADD', WORK, '*', 'op', 'create', 'd', cmsgpack.pack({batch = BATCH, gen = tonumber(gen), attempt = 0}))
end
flush()
return reply({'parked'})
