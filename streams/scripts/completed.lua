-- Record that a sent group finished, and decide the batch's report when it
-- was the last thing the batch waited for (see settle.lua).
-- KEYS, ARGV[1..2]: see settle.lua
-- ARGV: 3 gen, 4 group id, 5 status, 6 sent success, 7 sent failed
-- Returns {'completed'} or {'reported'} or {'duplicate'}
local gen, ss, sf = tonumber(ARGV[3]), tonumber(ARGV[6]), tonumber(ARGV[7])
local f = redis.call('HMGET', STATE, 'k:done/' .. gen, 'done', 'sent_success', 'sent_failed')
if f[1] then
  return reply({'duplicate'})
end
emit('done/' .. gen, 'group_completed',
  cmsgpack.pack({gen = gen, group_id = ARGV[4], status = ARGV[5], sent_success = ss, sent_failed = sf}))
put('g:' .. gen .. ':done', ARGV[5])
put('done', num(f[2]) + 1)
put('sent_success', num(f[3]) + ss)
put('sent_failed', num(f[4]) + sf)
if try_report() then
  return reply({'reported'})
end
return reply({'completed'})
