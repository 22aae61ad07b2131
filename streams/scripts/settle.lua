-- Prepended (after prelude.lua) to the scripts that can end a batch:
-- accept, reject, close, cancel, claim_send, loaded, completed (see
-- src/store/scripts/mod.rs).
-- They share one layout (SETTLE in src/store/scripts/declarations.rs):
-- keys STATE, EVENTS, WORK, ACTIVE, REPORTS, NUMBERS (the number log:
--      batch-wide dedupe), REPORTED (tombstones)
-- arguments BATCH, POLICY `<retention s>|<deliver 0|1>|<track 0|1>`
--       (whether a sent group's delivery results are tracked, see
--       completed.lua), then their own.
--
-- A batch ends (its report is decided, once) when it takes no more chunks
-- and every generation is done. It takes no more chunks when every seq
-- 0..last is assigned or refused for good (a *hole*: counted in `holes`,
-- marked `r:<seq>` = 1), or when an operator closed it (`closed`) or
-- cancelled it (`cancelled`).
local RETENTION, DELIVER, TRACK = string.match(POLICY, '^(%d+)|([01])|([01])$')
RETENTION = tonumber(RETENTION)

-- Whether the batch takes no more chunks, from its fields.
-- (Fields read with HMGET are `false` when absent.)
local function settled(closed, last, seqs, holes)
  if closed then
    return true
  end
  last = tonumber(last)
  return last ~= nil and num(seqs) + num(holes) == last + 1
end

-- A generation whose every assigned chunk is loaded, and which takes no more
-- chunks, is ready. With registered recipients, it gets its one send work
-- item; with none (every chunk failed, or held only duplicates) there is
-- nothing to send: it is done at once. Returns whether it is done.
local function make_ready(gen, chunks, registered)
  emit('ready/' .. gen, 'generation_ready', cmsgpack.pack({gen = gen, chunks = chunks}))
  put('g:' .. gen .. ':ready', 1)
  if registered > 0 then
    redis.call('XADD', WORK, '*', 'op', 'send', 'd', cmsgpack.pack({batch = BATCH, gen = gen, attempt = 0}))
    return false
  end
  emit('done/' .. gen, 'group_completed',
    cmsgpack.pack({gen = gen, group_id = '', status = 'empty', sent_success = 0, sent_failed = 0}))
  put('g:' .. gen .. ':done', 'empty')
  -- As the fold does (an increment creates the field).
  redis.call('HINCRBY', STATE, 'done', 1)
  redis.call('HINCRBY', STATE, 'sent_success', 0)
  redis.call('HINCRBY', STATE, 'sent_failed', 0)
  return true
end

-- Decides the batch's report if it takes no more chunks and every generation
-- is done; the report event's key `report` makes the decision once. The
-- outcome tells the truth: `completed` only when every recipient of every
-- expected chunk was registered and nothing was refused or given up (a
-- batch closed before its last seq was known is not complete: how many
-- chunks were expected is unknown); `failed` when nobody was registered;
-- otherwise `partial`. A cancelled batch reports `cancelled`, with the
-- generations it stopped and the registered recipients they held (unsent).
-- Returns whether it was decided now.
--
-- `report_from` decides from the fields REPORT_FIELDS, as the caller read
-- (and updated) them, so that a caller that reads them anyway saves a read;
-- what the caller put() is written with the report, in one HSET.
local REPORT_FIELDS = {'k:report', 'closed', 'last', 'seqs', 'holes', 'gen', 'done', 'recipients', 'registered',
  'failed', 'sent_success', 'sent_failed', 'duplicates', 'rejected', 'missing', 'cancelled', 'stopped', 'unsent',
  'last_conflict', 'unknown', 'origin'}

-- Whether no generation is left whose delivery tracking will decide the
-- batch's delivery report: every generation the provider finished
-- (COMPLETE or FAILED: the tracked ones) has its results counted
-- (`g:<g>:dl`). Then a `track` item without a group decides it (a batch
-- that sent nothing, or whose last generation ended unsent after the
-- others were counted); otherwise the last tracked generation does.
local function nothing_left_to_track(gens)
  for g = 0, gens - 1 do
    local s = redis.call('HMGET', STATE, 'g:' .. g .. ':done', 'g:' .. g .. ':dl')
    if (s[1] == 'COMPLETE' or s[1] == 'FAILED') and not s[2] then
      return false
    end
  end
  return true
end

local function report_from(f)
  if f[1] or not settled(f[2] or f[16], f[3], f[4], f[5]) then
    flush()
    return false
  end
  local gens = f[6] and tonumber(f[6]) + 1 or 0
  if num(f[7]) ~= gens then
    flush()
    return false
  end
  local registered, failed, rejected, missing = num(f[9]), num(f[10]), num(f[14]), num(f[15])
  local unsent, unknown = num(f[18]), num(f[20])
  local outcome = 'partial'
  if f[16] then
    outcome = 'cancelled'
  elseif registered == unsent then
    -- Nobody registered, or nothing registered went out (sends given up).
    outcome = 'failed'
  elseif failed == 0 and rejected == 0 and missing == 0 and unsent == 0 and unknown == 0 and tonumber(f[3]) then
    outcome = 'completed'
  end
  local report = {outcome = outcome, generations = gens, chunks = num(f[4]), recipients = num(f[8]),
    registered = registered, failed = failed, sent_success = num(f[11]), sent_failed = num(f[12]),
    duplicates = num(f[13]), rejected = rejected, missing = missing}
  if f[16] then
    report.stopped = num(f[17])
  end
  if unsent > 0 then
    report.unsent = unsent
  end
  if unknown > 0 then
    report.unknown = unknown
  end
  if f[19] then
    report.last_conflict = f[19]
  end
  if f[21] then
    report.origin = f[21]
  end
  if failed > 0 then
    -- `fr:<code>`: failed recipients by reason (once per batch, so one full read).
    local by, all = {}, redis.call('HGETALL', STATE)
    for i = 1, #all, 2 do
      local code = string.match(all[i], '^fr:(.+)$')
      if code then
        by[code] = tonumber(all[i + 1])
      end
    end
    report.failed_by_reason = by
  end
  local packed = cmsgpack.pack(report)
  local id = emit('report', 'batch_reported', packed)
  put('report', outcome)
  flush()
  redis.call('SREM', ACTIVE, BATCH)
  redis.call('XADD', REPORTS, '*', 'batch', BATCH, 'd', packed)
  if DELIVER == '1' then
    redis.call('XADD', WORK, '*', 'op', 'report', 'd', cmsgpack.pack({batch = BATCH, gen = 0, attempt = 0}))
  end
  if TRACK == '1' and nothing_left_to_track(gens) then
    redis.call('XADD', WORK, '*', 'op', 'track', 'd', cmsgpack.pack({batch = BATCH, gen = 0, attempt = 0}))
  end
  if RETENTION > 0 then
    redis.call('EXPIRE', STATE, RETENTION)
    redis.call('EXPIRE', EVENTS, RETENTION)
  end
  -- The numbers seen are no longer needed; the batch id is remembered (a
  -- tombstone, scored by the report's time) after its events expire, so that
  -- a late copy of its chunks is refused rather than sent again. Workers
  -- trim tombstones older than `--remember`.
  redis.call('DEL', NUMBERS)
  redis.call('ZADD', REPORTED, string.match(id, '^(%d+)'), BATCH)
  return true
end

-- The decision, from the state as written now.
local function try_report()
  flush()
  return report_from(redis.call('HMGET', STATE, unpack(REPORT_FIELDS)))
end

-- The batch takes no more chunks now: its current generation (if any) is
-- closed for `reason` (`final` or `closed`) and, when all its chunks are
-- loaded, made ready; then the report is decided if everything is done.
-- Closes generation `gen` for `reason` (`final`, `closed`, `failed`) unless
-- it is closed, and makes it ready when all its chunks are loaded.
local function close_generation(gen, reason)
  flush()
  local gk = 'g:' .. gen .. ':'
  local g = redis.call('HMGET', STATE, gk .. 'closed', gk .. 'c', gk .. 'l', gk .. 'n', gk .. 'reg')
  if g[1] then
    return
  end
  local c = num(g[2])
  emit('close/' .. gen, 'generation_closed', cmsgpack.pack({gen = gen, reason = reason, chunks = c, recipients = num(g[4])}))
  put(gk .. 'closed', reason)
  if num(g[3]) == c then
    make_ready(gen, c, num(g[5]))
  end
end

local function settle(reason)
  flush()
  local gen = redis.call('HGET', STATE, 'gen')
  if gen then
    close_generation(tonumber(gen), reason)
  end
  try_report()
end

-- Records a refused chunk (`input_rejected`, key reject/<seq>/<digest>),
-- once. `may_hole`: the refusal leaves seq `seq` without data for good
-- unless a corrected copy comes; it is a hole when that seq is not assigned
-- and not beyond the last seq. A hole is counted so that the batch can end
-- without it (and the hole that completes 0..last settles the batch).
--
-- `flagged_last`: the chunk was flagged `last`. Refused or not, the flag
-- tells a batch that does not know its end yet where it ends: at this seq,
-- or, when a higher seq already arrived (the flag contradicts it), at the
-- highest seq received; the contradiction is kept (`last_conflict`) and
-- named in the report. Either way the batch ends without an operator.
local function reject(seq, digest, reason, may_hole, flagged_last)
  local key = 'reject/' .. seq .. '/' .. digest
  local f = redis.call('HMGET', STATE, 'k:' .. key, 'r:' .. seq, 's:' .. seq, 'last', 'seqs', 'holes', 'rmax',
    'rejected', 'closed', 'max')
  if f[1] then
    return
  end
  local event = {seq = seq, reason = reason}
  local last = tonumber(f[4])
  local learned = flagged_last and last == nil and not f[9]
  if learned then
    local above = math.max(tonumber(f[10]) or -1, tonumber(f[7]) or -1)
    last = math.max(seq, above)
    event.last = last
    put('last', last)
    if above > seq then
      event.last_conflict = 'seq ' .. seq .. ' is flagged last, but seq ' .. above ..
        ' had already arrived: the batch ends at seq ' .. above
      put('last_conflict', event.last_conflict)
    end
  end
  local hole = may_hole and not f[3] and f[2] ~= '1' and (last == nil or seq <= last)
    and not settled(f[9], last, f[5], f[6])
  event.hole = hole
  emit(key, 'input_rejected', cmsgpack.pack(event))
  put('rejected', num(f[8]) + 1)
  local holes = num(f[6])
  if hole then
    -- A batch of refused chunks only is watched too (`--give-up-after`).
    redis.call('SADD', ACTIVE, BATCH)
    holes = holes + 1
    put('r:' .. seq, 1)
    put('holes', holes)
    if not f[7] or seq > tonumber(f[7]) then
      put('rmax', seq)
    end
  end
  if (hole or learned) and settled(f[9], last, f[5], holes) then
    settle('final')
  end
  flush()
end

-- Whether a batch with no state at all was reported and its events expired:
-- it is remembered by a tombstone.
local function tombstoned(nothing_recorded)
  return nothing_recorded and redis.call('ZSCORE', REPORTED, BATCH) ~= false
end

-- Stops generation g of a cancelled batch (its send not claimed, or its
-- claim given back): closed if it was not, done with status `cancelled`, its
-- group (if any) deleted at the provider by a `delete` work item. The caller
-- flushes, then counts it (`done`, `stopped`, `unsent`).
local function stop_generation(g, closed, group, chunks, recipients)
  local gk = 'g:' .. g .. ':'
  if not closed then
    emit('close/' .. g, 'generation_closed', cmsgpack.pack({gen = g, reason = 'cancelled', chunks = chunks, recipients = recipients}))
    put(gk .. 'closed', 'cancelled')
  end
  emit('done/' .. g, 'group_completed',
    cmsgpack.pack({gen = g, group_id = group or '', status = 'cancelled', sent_success = 0, sent_failed = 0}))
  put(gk .. 'done', 'cancelled')
  if group then
    redis.call('XADD', WORK, '*', 'op', 'delete', 'd', cmsgpack.pack({batch = BATCH, gen = g, group_id = group, attempt = 0}))
  end
end
