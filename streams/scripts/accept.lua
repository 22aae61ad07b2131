-- Accept a chunk and assign it to a generation, in one step; a number gets
-- the batch's message at most once (batch-wide dedupe, below).
-- Keys and arguments (ACCEPT in src/store/scripts/declarations.rs): settle.lua's,
-- then SEQ, LAST (0|1), COUNT, DIGEST, CAP, HINT (a generation),
--       SEEN, STAMP: where the caller's view of the number log ends,
--       DUPLICATES: the positions of the chunk's copies by that view,
--       FRAME: the chunk's frame for the number log (its COUNT numbers,
--       5 bytes big-endian each, between a count and a new stamp),
--       OPTS: the batch options, canonical (`<send_at ms>|<priority>|<quiet>`):
--       every chunk of a batch must carry the same; the first accepted sets
--       them (field `opts`),
--       then, for each further chunk of the batch to accept in the same
--       step: SEQ, LAST, COUNT, DIGEST, SEEN, STAMP, DUPLICATES, FRAME, OPTS
--       (its claim made as if the chunks before it were appended; CAP is
--       the first's, and its HINT the generation of the chunk before it)
-- The hint is the generation the caller last saw for this batch: its fields
-- are read in the same HMGET, which saves a second read on the common path
-- (a wrong hint only costs that second read).
-- Returns {'assigned'|'duplicate', gen, group id or '', loaded 0|1,
--          positions of recipients already given to the batch ('1,7')}
--      or {'conflict'|'rejected'|'refused', reason}
--      or {'behind', the log's length, the log from SEEN - 16 on}: the
--         caller's view of the number log is not the log's end; nothing
--         recorded
--  for the first chunk, followed by the same for each further chunk, each
--  as a list of its own. A further chunk is asked only while every one
--  before it was assigned (appended its frame): those not asked get no
--  reply, and the caller asks them again.
--  (rejected and conflict are recorded as input_rejected; refused, for a
--   batch that has ended or takes no more chunks, records nothing)
local cap, hint = tonumber(CAP), tonumber(HINT) or 0

-- The state fields this call read from Redis (`false` when absent). With
-- what put() wrote (`written`), they let every chunk of the call read
-- through one HMGET and write through one HSET: a further chunk's own
-- fields are read with the first chunk's, and the rest were read or
-- written by the chunks before it.
local known = {}

-- The values of `fields`: what this call wrote, else read, else one HMGET
-- of the fields it has not seen.
local function read(fields)
  local missing, asked = {}, {}
  for _, k in ipairs(fields) do
    if written[k] == nil and known[k] == nil and not asked[k] then
      missing[#missing + 1] = k
      asked[k] = true
    end
  end
  if #missing > 0 then
    local v = redis.call('HMGET', STATE, unpack(missing))
    for i, k in ipairs(missing) do
      known[k] = v[i]
    end
  end
  local values = {}
  for i, k in ipairs(fields) do
    local w = written[k]
    if w == nil then
      values[i] = known[k]
    else
      values[i] = w
    end
  end
  return values
end

-- The fields a chunk's accept reads first, with `hint` its generation's
-- guess.
local function fields_of(seq)
  local hk = 'g:' .. hint .. ':'
  local fields = {'s:' .. seq, 'last', 'max', 'gen', 'seqs', 'recipients',
    hk .. 'n', hk .. 'c', hk .. 'l', hk .. 'group', hk .. 'closed', hk .. 'reg',
    'x:' .. seq, 'report', 'closed', 'holes', 'rmax', 'r:' .. seq, 'rejected', 'duplicates', 'cancelled', 'opts',
    'dlen', 'dstamp', 'k:create/' .. hint}
  return fields
end

-- One chunk's accept: its reply (without the trailing elements `reply`
-- adds). Its state changes are put(), and flushed at the end of the call
-- (or before a read that does not go through `read`).
local function accept_one(seq, is_last, count, digest, SEEN, STAMP, DUPLICATES, FRAME, opts)
  local f = read(fields_of(seq))

  local function refused(why)
    return {'refused', 'batch ' .. BATCH .. ' ' .. why}
  end
  local function rejected(kind, why, may_hole)
    -- reject() reads the state from Redis: what the chunks before this one
    -- put goes first.
    flush()
    reject(seq, digest, why, may_hole, may_hole and is_last)
    return {kind, why}
  end

  if f[1] then
    -- A repeat delivery: same content is a no-op, other content a conflict.
    local g, d = string.match(f[1], '^(%d+)|%d+|(.*)$')
    if d == digest then
      local h = read({'g:' .. g .. ':group', 'k:loaded/' .. g .. '/' .. seq})
      if f[21] and not h[2] then
        -- Cancelled before it was loaded: it never will be.
        return refused('was cancelled (' .. f[21] .. '): seq ' .. seq .. ' will not be loaded')
      end
      return {'duplicate', g, h[1] or '', h[2] and '1' or '0', f[13] or ''}
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

  -- Batch-wide dedupe (src/protocol/numbers.rs). The caller found the
  -- chunk's copies (DUPLICATES: their positions, '1,7') in its view of the
  -- batch's number log, which ends at byte SEEN with the frame stamped STAMP.
  -- If the log still ends there, the copies are right as of now: the chunk's
  -- FRAME is appended in this same step. If not, nothing is written and the
  -- caller reads on and asks again. Redis does nothing per number.
  if tonumber(SEEN) ~= num(f[23]) or STAMP ~= (f[24] or '') then
    -- What the caller missed, from its view's stamp on (so that it can check
    -- its view still ends there) to the log's end.
    local missed = redis.call('GETRANGE', NUMBERS, math.max(tonumber(SEEN) - 16, 0), -1)
    return {'behind', tostring(num(f[23])), missed}
  end
  if #FRAME ~= 4 + 5 * count + 16 then
    return redis.error_reply('accept: a frame of ' .. #FRAME .. ' bytes for ' .. count .. ' numbers')
  end
  local dups = {}
  for p in string.gmatch(DUPLICATES, '%d+') do
    dups[#dups + 1] = tonumber(p)
  end
  redis.call('APPEND', NUMBERS, FRAME)
  put('dlen', num(f[23]) + #FRAME)
  put('dstamp', string.sub(FRAME, -16))
  count = count - #dups
  local recipients = num(f[6])

  local gen = num(f[4])
  local gk = 'g:' .. gen .. ':'
  local g
  if gen == hint then
    g = {f[7], f[8], f[9], f[10], f[11], f[12], f[25]}
  else
    g = read({gk .. 'n', gk .. 'c', gk .. 'l', gk .. 'group', gk .. 'closed', gk .. 'reg', 'k:create/' .. gen})
  end
  local n, c, l, group, requested = num(g[1]), num(g[2]), num(g[3]), g[4], g[7]

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
    gen, n, c, l, group, requested = gen + 1, 0, 0, 0, false, false
    gk = 'g:' .. gen .. ':'
  end

  n, c, seqs, recipients = n + count, c + 1, seqs + 1, recipients + count
  local assigned = {seq = seq, gen = gen, count = count, last = is_last, digest = digest}
  local positions = DUPLICATES
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
  if not group and not requested and count > 0 then
    -- The generation's first chunk with numbers to add asks for its group
    -- now, so that it can wait for it in its worker rather than park.
    emit('create/' .. gen, 'group_requested', cmsgpack.pack({gen = gen}))
    redis.call('XADD', WORK, '*', 'op', 'create', 'd', cmsgpack.pack({batch = BATCH, gen = gen, attempt = 0}))
  end
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
  -- The next chunk of this call most likely goes to the same generation:
  -- its fields are the ones this chunk read and wrote.
  hint = gen
  return {'assigned', tostring(gen), group or '', '0', positions}
end

-- The first chunk, then each further one while every one before it was
-- assigned (a chunk after one that was not would be behind: its claim
-- counts on the frame that was not appended).
-- One HMGET for the first chunk's fields and every further chunk's own.
local first = fields_of(tonumber(SEQ))
for i = NAMED_ARGS + 1, #ARGV - 8, 9 do
  local seq = tonumber(ARGV[i])
  first[#first + 1] = 's:' .. seq
  first[#first + 1] = 'x:' .. seq
  first[#first + 1] = 'r:' .. seq
end
read(first)
local replies = accept_one(tonumber(SEQ), LAST == '1', tonumber(COUNT), DIGEST, SEEN, STAMP,
  DUPLICATES, FRAME, OPTS)
local went_on = replies[1] == 'assigned'
local i = NAMED_ARGS + 1
while went_on and i + 8 <= #ARGV do
  local r = accept_one(tonumber(ARGV[i]), ARGV[i + 1] == '1', tonumber(ARGV[i + 2]), ARGV[i + 3],
    ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8])
  replies[#replies + 1] = r
  went_on = r[1] == 'assigned'
  i = i + 9
end
flush()
return reply(replies)
