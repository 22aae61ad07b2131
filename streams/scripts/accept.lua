-- Accept a chunk and assign it to a generation, in one step.
-- KEYS: state, events, work, active
-- ARGV: batch, seq, last (0|1), count, digest, cap, generation hint
-- The hint is the generation the caller last saw for this batch: its fields
-- are read in the same HMGET, which saves a second read on the common path
-- (a wrong hint only costs that second read).
-- Returns {'assigned'|'duplicate', gen, group id or '', loaded 0|1}
--      or {'conflict'|'rejected', reason}
local WORK, ACTIVE = KEYS[3], KEYS[4]
local seq, is_last, count, digest, cap, hint =
  tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]) or 0

local hk = 'g:' .. hint .. ':'
local f = redis.call('HMGET', STATE, 's:' .. seq, 'last', 'max', 'gen', 'seqs', 'recipients',
  hk .. 'n', hk .. 'c', hk .. 'l', hk .. 'group', hk .. 'closed')
if f[1] then
  -- A repeat delivery: same content is a no-op, other content a conflict.
  local g, d = string.match(f[1], '^(%d+)|%d+|(.*)$')
  if d ~= digest then
    return reply({'conflict', 'seq ' .. seq .. ' was already accepted with other content (digest ' .. d .. ', this one ' .. digest .. ')'})
  end
  local h = redis.call('HMGET', STATE, 'g:' .. g .. ':group', 'k:loaded/' .. g .. '/' .. seq)
  return reply({'duplicate', g, h[1] or '', h[2] and '1' or '0'})
end

local last, max = tonumber(f[2]), tonumber(f[3])
if last and seq > last then
  return reply({'rejected', 'seq ' .. seq .. ' is beyond the last seq ' .. last})
end
if is_last and last and last ~= seq then
  return reply({'rejected', 'seq ' .. seq .. ' is flagged last, but seq ' .. last .. ' already was'})
end
if is_last and max and max > seq then
  return reply({'rejected', 'seq ' .. seq .. ' is flagged last, but seq ' .. max .. ' was already accepted'})
end
if count > cap then
  return reply({'rejected', 'chunk has ' .. count .. ' recipients, more than the group cap ' .. cap})
end

local gen, seqs, recipients = num(f[4]), num(f[5]), num(f[6])
local gk = 'g:' .. gen .. ':'
local g
if gen == hint then
  g = {f[7], f[8], f[9], f[10], f[11]}
else
  g = redis.call('HMGET', STATE, gk .. 'n', gk .. 'c', gk .. 'l', gk .. 'group', gk .. 'closed')
end
local n, c, l, group = num(g[1]), num(g[2]), num(g[3]), g[4]

-- Approving this chunk would pass the cap (or the generation takes no more):
-- this script is the one closer; loading goes on in the next generation.
-- Approval counters are never given back.
if g[5] or (n > 0 and n + count > cap) then
  if not g[5] then
    emit('close/' .. gen, 'generation_closed', cmsgpack.pack({gen = gen, reason = 'full', chunks = c, recipients = n}))
    put(gk .. 'closed', 'full')
    if l == c then
      make_ready(WORK, gen, c)
    end
  end
  gen, n, c, group = gen + 1, 0, 0, false
  gk = 'g:' .. gen .. ':'
end

n, c, seqs, recipients = n + count, c + 1, seqs + 1, recipients + count
local assigned_id = emit('assign/' .. seq, 'chunk_assigned',
  cmsgpack.pack({seq = seq, gen = gen, count = count, last = is_last, digest = digest}))
put('s:' .. seq, gen .. '|' .. count .. '|' .. digest)
put(gk .. 'n', n)
put(gk .. 'c', c)
put('gen', gen)
put('seqs', seqs)
put('recipients', recipients)
if not max or seq > max then
  put('max', seq)
end
if is_last then
  put('last', seq)
  last = seq
end
if seqs == 1 then
  -- The batch's first chunk: it is in flight from now (t0) on.
  put('t0', string.match(assigned_id, '^(%d+)'))
  redis.call('SADD', ACTIVE, BATCH)
end
-- Every seq 0..last is assigned: this generation is the final one.
if last and seqs == last + 1 then
  emit('close/' .. gen, 'generation_closed', cmsgpack.pack({gen = gen, reason = 'final', chunks = c, recipients = n}))
  put(gk .. 'closed', 'final')
end
flush()
return reply({'assigned', tostring(gen), group or '', '0'})
