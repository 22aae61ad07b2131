-- Record that a sent group finished, and decide the batch's report when every
-- generation has: the report event's key `report` makes the decision once.
-- KEYS: state, events, active, reports, work
-- ARGV: batch, gen, group id, status, sent success, sent failed, retention seconds, deliver (0|1)
-- Returns {'completed'} or {'reported'} or {'duplicate'}
local ACTIVE, REPORTS, WORK = KEYS[3], KEYS[4], KEYS[5]
local gen, ss, sf = tonumber(ARGV[2]), tonumber(ARGV[5]), tonumber(ARGV[6])
local f = redis.call('HMGET', STATE, 'k:done/' .. gen, 'done', 'gen', 'last', 'seqs', 'sent_success', 'sent_failed',
  'recipients', 'registered', 'failed', 'k:report')
if f[1] then
  return reply({'duplicate'})
end
emit('done/' .. gen, 'group_completed',
  cmsgpack.pack({gen = gen, group_id = ARGV[3], status = ARGV[4], sent_success = ss, sent_failed = sf}))
local done = num(f[2]) + 1
ss, sf = num(f[6]) + ss, num(f[7]) + sf
put('g:' .. gen .. ':done', ARGV[4])
put('done', done)
put('sent_success', ss)
put('sent_failed', sf)
local all_assigned = f[4] and num(f[5]) == tonumber(f[4]) + 1
if all_assigned and done == num(f[3]) + 1 and not f[11] then
  local report = cmsgpack.pack({outcome = 'completed', generations = done, chunks = num(f[5]),
    recipients = num(f[8]), registered = num(f[9]), failed = num(f[10]), sent_success = ss, sent_failed = sf})
  emit('report', 'batch_reported', report)
  put('report', 'completed')
  flush()
  redis.call('SREM', ACTIVE, BATCH)
  redis.call('XADD', REPORTS, '*', 'batch', BATCH, 'd', report)
  if ARGV[8] == '1' then
    redis.call('XADD', WORK, '*', 'op', 'report', 'd', cmsgpack.pack({batch = BATCH, gen = 0, attempt = 0}))
  end
  local ttl = tonumber(ARGV[7])
  if ttl > 0 then
    redis.call('EXPIRE', STATE, ttl)
    redis.call('EXPIRE', EVENTS, ttl)
  end
  return reply({'reported'})
end
flush()
return reply({'completed'})
