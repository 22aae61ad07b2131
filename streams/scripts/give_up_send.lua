-- Record that a generation's send, or what follows it, was given up (the
-- provider refused it for good, it kept failing past `--retry-for`, or the
-- count check refused it), so that the generation, and the batch, still end
-- truthfully:
--   * `send`: the send item is given up. The generation takes no claim any
--     more (`g:<gen>:failed` = send; claim_send.lua answers `done`), so no
--     later try or redrive can send it.
--       - With no claim in place, nothing went out (a send starts only under
--         a claim): the generation is done, status `unsent`, its registered
--         recipients counted `unsent`, and its group deleted at the provider
--         (a `delete` work item).
--       - With a claim in place, the send may have gone out (its answer
--         lost): a `recall` work item asks the provider. Deleted there, it
--         can never go out: `unsent` (below). Found sent: recorded as sent
--         (sent.lua), and polled as any other.
--   * `unsent`: the recall deleted the group (or found it deleted): done,
--     status `unsent`.
--   * `poll`, `recall`: the group's outcome cannot be learned (a poll given
--     up after the send; a recall given up): done, status `unknown`, its
--     registered recipients counted `unknown`.
-- Each appends `generation_failed` (key failed/<gen> for the send,
-- failed/<gen>/<what> for the others) and, when the generation is done,
-- `group_completed`; then the report is decided when it was the last.
-- Keys and arguments: settle.lua's, then GEN, WHAT (`send`, `unsent`, `poll`, `recall`),
--       REASON, GROUP: the generation's group id ('' when unknown)
-- Returns {'unsent', recipients} or {'recalling'} or {'unknown', recipients}
--      or {'sent'} (the send was recorded: nothing to give up; its poll goes on)
--      or {'done'} (the generation is done: nothing to record)
--      or {'stale'} (what the item rested on is not recorded: a send of a
--         generation not ready, a poll of one not sent, a recall of one whose
--         send was not given up; writes Redis lost: nothing given up, the
--         generation gets its own items again when it gets there)
local gen, what, reason, group = tonumber(GEN), WHAT, REASON, GROUP
local gk = 'g:' .. gen .. ':'
local f = redis.call('HMGET', STATE, gk .. 'done', 'k:send/' .. gen, gk .. 'failed', gk .. 'claimed', gk .. 'back',
  gk .. 'reg', gk .. 'ready')
if f[1] then
  return reply({'done'})
end
local rests_on = {send = f[7], poll = f[2], unsent = f[3] == 'send', recall = f[3] == 'send'}
if not rests_on[what] then
  return reply({'stale'})
end
local registered = num(f[6])

-- The generation is done with `status` (`unsent` or `unknown`), its
-- registered recipients counted under that name.
local function finish(status)
  local data = {gen = gen, group_id = group, status = status, sent_success = 0, sent_failed = 0}
  if registered > 0 then
    data.recipients = registered
  end
  emit('done/' .. gen, 'group_completed', cmsgpack.pack(data))
  put(gk .. 'done', status)
  flush()
  -- As the fold does (an increment creates the field).
  redis.call('HINCRBY', STATE, 'done', 1)
  redis.call('HINCRBY', STATE, 'sent_success', 0)
  redis.call('HINCRBY', STATE, 'sent_failed', 0)
  redis.call('HINCRBY', STATE, status, registered)
  try_report()
  return reply({status, tostring(registered)})
end

if what == 'send' then
  if f[2] then
    return reply({'sent'})
  end
  if f[3] then
    return reply({'recalling'})
  end
  local n = num(f[4])
  local claimed = n > num(f[5]) and redis.call('HEXISTS', STATE, 'k:' .. (n == 1 and ('claim/' .. gen)
    or ('claim/' .. gen .. '/' .. n))) == 1
  emit('failed/' .. gen, 'generation_failed', cmsgpack.pack({gen = gen, op = 'send', reason = reason,
    recall = claimed}))
  put(gk .. 'failed', 'send')
  if claimed then
    redis.call('XADD', WORK, '*', 'op', 'recall', 'd', cmsgpack.pack({batch = BATCH, gen = gen, group_id = group,
      attempt = 0}))
    flush()
    return reply({'recalling'})
  end
  if group ~= '' then
    redis.call('XADD', WORK, '*', 'op', 'delete', 'd', cmsgpack.pack({batch = BATCH, gen = gen, group_id = group,
      attempt = 0}))
  end
  return finish('unsent')
end
if what == 'unsent' then
  return finish('unsent')
end
emit('failed/' .. gen .. '/' .. what, 'generation_failed', cmsgpack.pack({gen = gen, op = what, reason = reason}))
return finish('unknown')
