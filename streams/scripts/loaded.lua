-- Record that every message of a chunk was accepted by the provider, and
-- evaluate the generation's completion equation:
--   closed and loaded == assigned  =>  ready (one send work item)
-- KEYS: state, events, work
-- ARGV: batch, gen, seq, registered, failed, event data
-- Returns {'loaded', ready 0|1} or {'duplicate'}
local WORK = KEYS[3]
local gen, seq, reg, failed = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local gk = 'g:' .. gen .. ':'
local key = 'loaded/' .. gen .. '/' .. seq
local f = redis.call('HMGET', STATE, 'k:' .. key, gk .. 'l', gk .. 'c', gk .. 'closed', gk .. 'reg', gk .. 'fail',
  'registered', 'failed', gk .. 'ready')
if f[1] then
  return reply({'duplicate'})
end
emit(key, 'chunk_loaded', ARGV[6])
local l, c = num(f[2]) + 1, num(f[3])
put(gk .. 'l', l)
put(gk .. 'reg', num(f[5]) + reg)
put(gk .. 'fail', num(f[6]) + failed)
put('registered', num(f[7]) + reg)
put('failed', num(f[8]) + failed)
local ready = f[4] and l == c and not f[9]
if ready then
  make_ready(WORK, gen, c)
end
flush()
return reply({'loaded', ready and '1' or '0'})
