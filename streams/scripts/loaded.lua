-- Record that a chunk is done at the provider (every message accepted, or
-- given up on with failures), and evaluate the generation's completion
-- equation:
--   closed and loaded == assigned  =>  ready (one send work item)
-- Keys and arguments: settle.lua's, then GEN, SEQ, REGISTERED, FAILED, DATA (the event's),
--       FAILED_BY_REASON (`code=n` pairs joined by `,`, or ''),
--       UNSURE: recipients whose registration is unknown (a given-up add
--         may have registered some before it failed)
-- Returns {'loaded', ready 0|1} or {'duplicate'}
--      or {'cancelled'} (the batch was cancelled: its generations not sent
--       are done, and nothing more is recorded into them)
local gen, seq, reg, failed, unsure = tonumber(GEN), SEQ, tonumber(REGISTERED), tonumber(FAILED), tonumber(UNSURE)
local gk = 'g:' .. gen .. ':'
local key = 'loaded/' .. gen .. '/' .. seq
local f = redis.call('HMGET', STATE, 'k:' .. key, gk .. 'l', gk .. 'c', gk .. 'closed', gk .. 'reg', gk .. 'fail',
  'registered', 'failed', gk .. 'ready', gk .. 'unsure', 'cancelled')
if f[1] then
  return reply({'duplicate'})
end
if f[11] then
  return reply({'cancelled'})
end
emit(key, 'chunk_loaded', DATA)
local l, c, greg = num(f[2]) + 1, num(f[3]), num(f[5]) + reg
put(gk .. 'l', l)
put(gk .. 'reg', greg)
put(gk .. 'fail', num(f[6]) + failed)
put('registered', num(f[7]) + reg)
put('failed', num(f[8]) + failed)
if unsure > 0 then
  put(gk .. 'unsure', num(f[10]) + unsure)
end
for code, n in string.gmatch(FAILED_BY_REASON, '([^,=]+)=(%d+)') do
  redis.call('HINCRBY', STATE, 'fr:' .. code, n)
end
local ready = f[4] and l == c and not f[9]
if ready and make_ready(gen, c, greg) then
  try_report()
end
flush()
return reply({'loaded', ready and '1' or '0'})
