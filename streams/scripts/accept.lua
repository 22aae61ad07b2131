-- Accept a chunk and assign it to a generation, in one step; a number gets
-- the batch's message at most once (batch-wide dedupe, below).
-- Keys and arguments (ACCEPT in src/store/scripts/declarations.rs): settle.lua's,
-- then SEQ, LAST (0|1), COUNT, DIGEST, CAP, HINT (a generation),
--       NUMBERS: each recipient's number, 5 bytes big-endian (the number
--       `0XXXXXXXX..` read as the integer `10XXXXXXXX..`), in chunk order,
--       OPTS: the batch options, canonical (`<send_at ms>|<priority>|<quiet>`):
--       every chunk of a batch must carry the same; the first accepted sets
--       them (field `opts`)
-- The hint is the generation the caller last saw for this batch: its fields
-- are read in the same HMGET, which saves a second read on the common path
-- (a wrong hint only costs that second read).
-- Returns {'assigned'|'duplicate', gen, group id or '', loaded 0|1,
--          positions of recipients already given to the batch ('1,7')}
--      or {'conflict'|'rejected'|'refused', reason}
--  (rejected and conflict are recorded as input_rejected; refused, for a
--   batch that has ended or takes no more chunks, records nothing)
local seq, is_last, count, digest, cap, hint, numbers = tonumber(SEQ), LAST == '1', tonumber(COUNT),
  DIGEST, tonumber(CAP), tonumber(HINT) or 0, NUMBERS
local opts = OPTS

local hk = 'g:' .. hint .. ':'
local f = redis.call('HMGET', STATE, 's:' .. seq, 'last', 'max', 'gen', 'seqs', 'recipients',
  hk .. 'n', hk .. 'c', hk .. 'l', hk .. 'group', hk .. 'closed', hk .. 'reg',
  'x:' .. seq, 'report', 'closed', 'holes', 'rmax', 'r:' .. seq, 'rejected', 'duplicates', 'cancelled', 'opts',
  'dkept')

local function refused(why)
  return reply({'refused', 'batch ' .. BATCH .. ' ' .. why})
end
local function rejected(kind, why, may_hole)
  reject(seq, digest, why, may_hole, may_hole and is_last)
  return reply({kind, why})
end

if f[1] then
  -- A repeat delivery: same content is a no-op, other content a conflict.
  local g, d = string.match(f[1], '^(%d+)|%d+|(.*)$')
  if d == digest then
    local h = redis.call('HMGET', STATE, 'g:' .. g .. ':group', 'k:loaded/' .. g .. '/' .. seq)
    if f[21] and not h[2] then
      -- Cancelled before it was loaded: it never will be.
      return refused('was cancelled (' .. f[21] .. '): seq ' .. seq .. ' will not be loaded')
    end
    return reply({'duplicate', g, h[1] or '', h[2] and '1' or '0', f[13] or ''})
  end
  if f[14] or f[15] or f[21] then
    return refused('has ended: seq ' .. seq .. ' came again with other content')
  end
  return rejected('conflict', 'seq ' .. seq .. ' was already accepted with other content (digest ' .. d ..
    ', this one ' .. digest .. ')', false)
end
if f[14] then
  return refused('was already reported (' .. f[14] .. '): it takes no more chunks')
end
if f[21] then
  return refused('was cancelled (' .. f[21] .. '): it takes no more chunks')
end
if f[15] then
  return refused('was closed (' .. f[15] .. '): it takes no more chunks')
end
if tombstoned(not f[5] and not f[16] and not f[19]) then
  return refused('was already reported (its events have expired): it takes no more chunks')
end

local last, max, rmax = tonumber(f[2]), tonumber(f[3]), tonumber(f[17])
local seqs, holes = num(f[5]), num(f[16])
if last and seq > last then
  return rejected('rejected', 'seq ' .. seq .. ' is beyond the last seq ' .. last, false)
end
if settled(false, last, seqs, holes) then
  -- Every seq 0..last is assigned or a hole: this one was refused before.
  return refused('went on without seq ' .. seq .. ' (refused earlier): it takes no more chunks')
end
if is_last and last and last ~= seq then
  return rejected('rejected', 'seq ' .. seq .. ' is flagged last, but seq ' .. last .. ' already was', true)
end
if is_last and max and max > seq then
  return rejected('rejected', 'seq ' .. seq .. ' is flagged last, but seq ' .. max .. ' was already accepted', true)
end
if is_last and rmax and rmax > seq then
  return rejected('rejected', 'seq ' .. seq .. ' is flagged last, but seq ' .. rmax .. ' was already received', true)
end
if count > cap then
  return rejected('rejected', 'chunk has ' .. count .. ' recipients, more than the group cap ' .. cap, true)
end
if f[22] and f[22] ~= opts then
  return rejected('conflict', 'seq ' .. seq .. ' has the batch options ' .. opts .. ', but the batch has ' .. f[22], true)
end

-- Batch-wide dedupe. The numbers given so far live in the hash DEDUPE as
-- 5-byte records, spread over buckets by linear hashing on the number: about
-- PER_BUCKET records a bucket, so a lookup scans ~160 bytes and a number
-- costs ~7 bytes of Redis memory. The bucket count is a pure function of the
-- records the hash keeps (the state's field `dkept`, read with the rest of
-- the state; absent, every number given so far: `recipients`), so no other
-- bookkeeping is stored. Looked up under the
-- current buckets, then buckets are split for the numbers added; one read
-- and one write.
--
-- A large batch's mobile numbers (010-XXXX-XXXX) go to a bitmap instead,
-- DEDUPE_MOBILE, one bit per number of that range: a BITFIELD SET both adds
-- them and says which it had, a few times cheaper in Redis CPU than the
-- buckets' Lua. The bitmap is up to 12.5 MB whatever the batch size, so a
-- batch takes it only once it has BITMAP_FROM numbers (the policy's third
-- part): the chunk that finds it so moves the mobile records out of the
-- buckets into the bitmap and rebuilds the buckets with the others
-- (`dkept` is set from then on).
local PER_BUCKET = 32
local MOBILE_LOW, MOBILE_HIGH = 101000000000, 101100000000
local recipients = num(f[6])
local bucketed = tonumber(f[23])
local function bucket_count(n)
  return math.max(1, math.ceil(n / PER_BUCKET))
end
local function layout(b) -- b = 2^i + p, 0 <= p < 2^i
  local i = 0
  while 2 ^ (i + 1) <= b do
    i = i + 1
  end
  return i, b - 2 ^ i
end
-- The split after bucket p at level i: the next bucket to split.
local function next_split(i, p)
  p = p + 1
  if p == 2 ^ i then
    return i + 1, 0
  end
  return i, p
end

-- Reads and writes go in pages: Lua's unpack() takes at most ~8,000
-- values, and a large chunk of a large batch touches a bucket per number.
-- A page is 7,000 values: a chunk of up to 7,000 numbers reads its buckets
-- with one HMGET (a write page, bucket and content, holds 3,500 buckets; a
-- BITFIELD page, 1,750 numbers).
local PAGE = 7000
local byte, sub, find = string.byte, string.sub, string.find

-- Sets the bitmap's bits for `offsets` (BITFIELD SET, in pages); calls
-- seen(j) for each offsets[j] whose bit was set already, in order (so a
-- number twice in one call is seen the second time).
local function set_bits(offsets, seen)
  local n = #offsets
  for i = 1, n, PAGE / 4 do
    -- The value as a string (a Lua number costs Redis a sprintf each) and
    -- a counter rather than `#ops` (a search each): for 200 pages of 5,000
    -- numbers, 0.85 s of script time instead of 1.15 (docs/benchmarks.md).
    local j, ops, o = math.min(i + PAGE / 4 - 1, n), {}, 0
    for x = i, j do
      ops[o + 1], ops[o + 2], ops[o + 3], ops[o + 4] = 'SET', 'u1', offsets[x], '1'
      o = o + 4
    end
    local old = redis.call('BITFIELD', DEDUPE_MOBILE, unpack(ops))
    for x = 1, #old do
      if old[x] == 1 then
        seen(i + x - 1)
      end
    end
  end
end

-- Buckets 0..b-1 of the hash, read in pages: bucket → records.
local function read_buckets(b)
  local content = {}
  for i = 0, b - 1, PAGE do
    local names = {}
    for x = i, math.min(i + PAGE, b) - 1 do
      names[#names + 1] = x
    end
    local got = redis.call('HMGET', DEDUPE, unpack(names))
    for x = 1, #got do
      if got[x] then
        content[names[x]] = got[x]
      end
    end
  end
  return content
end

-- HSET of the buckets named in `dirty`, in pages.
local function write_buckets(content, dirty)
  local writes = {}
  for b in pairs(dirty) do
    writes[#writes + 1] = b
    writes[#writes + 1] = content[b] or ''
  end
  for i = 1, #writes, PAGE do
    redis.call('HSET', DEDUPE, unpack(writes, i, math.min(i + PAGE - 1, #writes)))
  end
end

-- The batch reaches BITMAP_FROM numbers: its mobile records move to the
-- bitmap, the buckets are rebuilt with the others (in bucket order, then
-- record order, so that the outcome is a function of the hash's content).
local kept_was = bucketed
if not bucketed and recipients >= BITMAP_FROM then
  local old = read_buckets(recipients > 0 and bucket_count(recipients) or 0)
  local offsets, rest = {}, {}
  for bk = 0, bucket_count(recipients) - 1 do
    local s = old[bk] or ''
    for at = 1, #s, 5 do
      local a, b, c, d, e = byte(s, at, at + 4)
      local v = (((a * 256 + b) * 256 + c) * 256 + d) * 256 + e
      if v >= MOBILE_LOW and v < MOBILE_HIGH then
        offsets[#offsets + 1] = v - MOBILE_LOW
      else
        rest[#rest + 1] = v
      end
    end
  end
  set_bits(offsets, function() end)
  redis.call('DEL', DEDUPE)
  local i, p = layout(bucket_count(#rest))
  local low, high = 2 ^ i, 2 ^ (i + 1)
  local lists, dirty = {}, {}
  for _, v in ipairs(rest) do
    local bk = v % low
    if bk < p then
      bk = v % high
    end
    local list = lists[bk]
    if not list then
      list = {}
      lists[bk], dirty[bk] = list, true
    end
    list[#list + 1] = string.char(math.floor(v / 2 ^ 32), math.floor(v / 2 ^ 24) % 256,
      math.floor(v / 2 ^ 16) % 256, math.floor(v / 256) % 256, v % 256)
  end
  for bk, list in pairs(lists) do
    lists[bk] = table.concat(list)
  end
  write_buckets(lists, dirty)
  bucketed = #rest
end

-- The bucket of a record's value under b0 buckets (powers computed once:
-- this runs for every number of the chunk).
local kept = bucketed or recipients
local b0 = bucket_count(kept)
local i0, p0 = layout(b0)
local low, high0 = 2 ^ i0, 2 ^ (i0 + 1)
local content, dirty = {}, {}
-- The chunk's numbers for the buckets: position, record, bucket; and for
-- the bitmap: position, offset.
local at_b, recs, where = {}, {}, {}
local at_m, offsets, nm = {}, {}, 0
local wanted, names = {}, {}
for k = 1, count do
  local at = 5 * k - 4
  local a, b, c, d, e = byte(numbers, at, at + 4)
  local v = (((a * 256 + b) * 256 + c) * 256 + d) * 256 + e
  if bucketed and v >= MOBILE_LOW and v < MOBILE_HIGH then
    nm = nm + 1
    at_m[nm], offsets[nm] = k, v - MOBILE_LOW
  else
    local bk = v % low
    if bk < p0 then
      bk = v % high0
    end
    local j = #recs + 1
    at_b[j], recs[j], where[j] = k, sub(numbers, at, at + 4), bk
    if not wanted[bk] then
      wanted[bk] = true
      names[#names + 1] = bk
    end
  end
end
local nb = #recs
-- Buckets that growing by the chunk's numbers could split (existing ones only).
do
  local i, p = i0, p0
  for _ = b0, bucket_count(kept + nb) - 1 do
    if p < b0 and not wanted[p] then
      wanted[p] = true
      names[#names + 1] = p
    end
    i, p = next_split(i, p)
  end
end
if kept > 0 and nb > 0 then
  for i = 1, #names, PAGE do
    local got = redis.call('HMGET', DEDUPE, unpack(names, i, math.min(i + PAGE - 1, #names)))
    for k = 1, #got do
      if got[k] then
        content[names[i + k - 1]] = got[k]
      end
    end
  end
end
-- A record in its bucket, or earlier in this chunk, is a copy.
local copy, added, fresh, pending = {}, 0, {}, {}
for j = 1, nb do
  local rec, bk = recs[j], where[j]
  local held = fresh[rec]
  local s = content[bk]
  if s and not held then
    local at = find(s, rec, 1, true)
    while at do
      if (at - 1) % 5 == 0 then
        held = true
        break
      end
      at = find(s, rec, at + 1, true)
    end
  end
  if held then
    copy[at_b[j]] = true
  else
    fresh[rec] = true
    local list = pending[bk]
    if list then
      list[#list + 1] = rec
    else
      pending[bk] = {rec}
    end
    added = added + 1
  end
end
for bk, list in pairs(pending) do
  content[bk] = (content[bk] or '') .. table.concat(list)
  dirty[bk] = true
end
do
  local i, p = i0, p0
  for _ = b0, bucket_count(kept + added) - 1 do
    local s, stay, move = content[p] or '', {}, {}
    local high = p + 2 ^ i
    local m = 2 ^ (i + 1)
    for at = 1, #s, 5 do
      local rec = sub(s, at, at + 4)
      local a, b, c, d, e = byte(rec, 1, 5)
      if ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) % m == p then
        stay[#stay + 1] = rec
      else
        move[#move + 1] = rec
      end
    end
    content[p], content[high] = table.concat(stay), table.concat(move)
    dirty[p], dirty[high] = true, true
    i, p = next_split(i, p)
  end
end
-- `dkept` is written when it changes (the chunk that made the bitmap, or
-- that added to the buckets), with the state.
local kept_now = bucketed and bucketed + added
write_buckets(content, dirty)
if kept_now and kept_now ~= kept_was then
  put('dkept', kept_now)
end
local dups = {}
set_bits(offsets, function(j)
  copy[at_m[j]] = true
end)
for k = 1, count do
  if copy[k] then
    dups[#dups + 1] = k - 1
  end
end
count = count - #dups

local gen = num(f[4])
local gk = 'g:' .. gen .. ':'
local g
if gen == hint then
  g = {f[7], f[8], f[9], f[10], f[11], f[12]}
else
  g = redis.call('HMGET', STATE, gk .. 'n', gk .. 'c', gk .. 'l', gk .. 'group', gk .. 'closed', gk .. 'reg')
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
      make_ready(gen, c, num(g[6]))
    end
  end
  gen, n, c, l, group = gen + 1, 0, 0, 0, false
  gk = 'g:' .. gen .. ':'
end

n, c, seqs, recipients = n + count, c + 1, seqs + 1, recipients + count
local assigned = {seq = seq, gen = gen, count = count, last = is_last, digest = digest}
local positions = table.concat(dups, ',')
if not f[22] then
  assigned.opts = opts
end
if #dups > 0 then
  assigned.duplicates = dups
  put('x:' .. seq, positions)
  put('duplicates', num(f[20]) + #dups)
end
if f[18] == '1' then
  -- A corrected copy of a seq refused earlier: no longer a hole.
  put('r:' .. seq, 0)
  holes = holes - 1
  put('holes', holes)
end
local assigned_id = emit('assign/' .. seq, 'chunk_assigned', cmsgpack.pack(assigned))
put('s:' .. seq, gen .. '|' .. count .. '|' .. digest)
put(gk .. 'n', n)
put(gk .. 'c', c)
put('gen', gen)
put('seqs', seqs)
put('recipients', recipients)
if not max or seq > max then
  put('max', seq)
end
if not f[22] then
  put('opts', opts)
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
-- Every seq 0..last is assigned (or a hole): this generation is the final one.
if settled(false, last, seqs, holes) then
  emit('close/' .. gen, 'generation_closed', cmsgpack.pack({gen = gen, reason = 'final', chunks = c, recipients = n}))
  put(gk .. 'closed', 'final')
end
flush()
return reply({'assigned', tostring(gen), group or '', '0', positions})
