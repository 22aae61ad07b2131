-- Record that a sent group finished, and decide the batch's report when it
-- was the last thing the batch waited for (see settle.lua).
-- Keys and arguments: settle.lua's, then GEN, GROUP (its id), STATUS,
-- SENT_SUCCESS, SENT_FAILED
-- A group the provider finished (COMPLETE or FAILED) gets a `track` work
-- item when the policy says so: it reads the messages' delivery results
-- (src/worker/ops/track_delivery.rs) until each has one or the delivery
-- window ends. Enqueued here, with the fact, so that no finished group goes
-- untracked whatever crashes after.
-- A generation whose send is not on record is not completed: Redis lost
-- its `send_triggered` with its unsynced writes while this poll, already in
-- hand, went on. Recording it would report a batch whose log never shows
-- the send; the send item, redelivered, finds the group sent and records
-- the send and a poll of its own, which completes it.
-- Returns {'completed'} or {'reported'} or {'duplicate'}, or {'not_sent'}
-- (nothing recorded)
local gen, ss, sf = tonumber(GEN), tonumber(SENT_SUCCESS), tonumber(SENT_FAILED)
-- One read: this group's keys, then the fields the report decision reads.
local f = redis.call('HMGET', STATE, 'k:done/' .. gen, 'k:send/' .. gen, unpack(REPORT_FIELDS))
if f[1] then
  return reply({'duplicate'})
end
if not f[2] then
  return reply({'not_sent'})
end
table.remove(f, 1)
table.remove(f, 1)
emit('done/' .. gen, 'group_completed',
  cmsgpack.pack({gen = gen, group_id = GROUP, status = STATUS, sent_success = ss, sent_failed = sf}))
-- (indexes in REPORT_FIELDS: 7 done, 11 sent_success, 12 sent_failed)
f[7], f[11], f[12] = num(f[7]) + 1, num(f[11]) + ss, num(f[12]) + sf
put('g:' .. gen .. ':done', STATUS)
put('done', f[7])
put('sent_success', f[11])
put('sent_failed', f[12])
if TRACK == '1' and (STATUS == 'COMPLETE' or STATUS == 'FAILED') then
  redis.call('XADD', WORK, '*', 'op', 'track', 'd', cmsgpack.pack({batch = BATCH, gen = gen, group_id = GROUP, attempt = 0}))
end
if report_from(f) then
  return reply({'reported'})
end
return reply({'completed'})
