-- Claim a generation's send, before the provider is asked to send it, and
-- decide the batch's schedule in the same atomic step, on the Redis clock.
--
-- The claim and cancel.lua are linearized on the batch's state: either the
-- cancel came first (the claim is refused and the group never sent) or the
-- claim did (the cancel leaves this generation alone). A claim is claim
-- number n of its generation (`g:<gen>:claimed` = n, event key
-- `claim/<gen>`, then `claim/<gen>/<n>`); it is given back when a later call
-- finds the batch held (`g:<gen>:back` = n, event `claim_given_back`, key
-- `back/<gen>/<n>`): so a retry that finds quiet hours does not hold the
-- send with the claim in place, and a cancel stops it. A claim given back in
-- a cancelled batch (the cancel saw it in place) stops its generation there
-- and then, as the cancel would have.
--
-- Every call decides the schedule again: a claim answer grants the send
-- until `until` (Redis ms): `now + lifetime`, cut where the next quiet window
-- opens; a new claim records it (`send_claimed.until_ms`, `g:<gen>:until`).
-- The provider call must start before it; a worker that cannot (a limiter
-- wait, a durability wait, a crash) calls again, which re-checks the
-- schedule and either renews the claim or gives it back. In a cancelled
-- batch a claim is never renewed past its recorded end: a renewal answers
-- no later end, and a call after it gives the claim back (reason
-- `expired`) and stops the generation.
--
-- Keys and arguments: settle.lua's, then GEN, MODE (`claim`, or `check`: decide the schedule and record
--       a hold, but take no claim and give none back), LIFETIME ms, SEND_AT ms
--       (empty: none), QUIET: the quiet window `from|opens|closes` in Unix ms
--       (empty: none), computed by the worker from a Redis clock reading with
--       the zone database Lua lacks (ScheduleArgs in src/events/options.rs)
-- Returns {'claimed', entry id of the claim, until, now, n, 'new'|'renewed'}
--      or {'free', now} (check: the send may go)
--      or {'held', at, reason, now, given back 0|1}
--      or {'stale', now} (the window given does not cover now: compute again)
--      or {'cancelled', reason} (cancelled before any claim in place, or a
--          claim given back in a cancelled batch: its generation stopped)
--      or {'done'} (sent, done, or its send given up: nothing to claim)

-- The schedule at `now` (pure; src/events/options.rs `hold` is its mirror).
-- Returns 'free', until | 'held', at, reason | 'stale'.
local function hold(now, lifetime, send_at, from, opens, closes)
  local due = now
  if send_at and send_at > now then
    due = send_at
  end
  local untl = now + lifetime
  if from then
    if due < from or due >= closes then
      return 'stale'
    end
    if due >= opens then
      return 'held', closes, 'quiet_hours'
    end
    untl = math.min(untl, opens)
  end
  if send_at and now < send_at then
    return 'held', send_at, 'send_at'
  end
  return 'free', untl
end

local gen, mode, lifetime = tonumber(GEN), MODE, tonumber(LIFETIME)
local send_at = tonumber(SEND_AT)
local from, opens, closes = string.match(QUIET, '^(%d+)|(%d+)|(%d+)$')
from, opens, closes = tonumber(from), tonumber(opens), tonumber(closes)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gk = 'g:' .. gen .. ':'
local f = redis.call('HMGET', STATE, gk .. 'claimed', gk .. 'back', 'cancelled', 'k:send/' .. gen, gk .. 'done',
  gk .. 'group', 'k:schedule/' .. gen, gk .. 'closed', gk .. 'reg', gk .. 'c', gk .. 'n', gk .. 'failed',
  gk .. 'until')
local n = num(f[1])
local live = n > num(f[2])
-- The claim in place, by its event's key; a state that lost that key (a
-- write Redis lost) holds no claim: it is taken again under the same number.
local function claim_key(k)
  return k == 1 and ('claim/' .. gen) or ('claim/' .. gen .. '/' .. k)
end
local claim_id
if live then
  claim_id = redis.call('HGET', STATE, 'k:' .. claim_key(n))
  if not claim_id then
    live, n = false, n - 1
  end
end
if not live and f[3] then
  return reply({'cancelled', f[3]})
end
-- Sent, done, or its send given up (give_up_send.lua): a send given up is
-- never claimed again, so that no retry or redrive sends it after.
if f[4] or f[5] or f[12] then
  return reply({'done'})
end
-- A claim in place in a cancelled batch lives no longer than it was given:
-- past its end its send never started (a send starts within its claim's
-- lifetime, and the caller has just read the group unsent), so it is given
-- back and its generation stopped, as the cancel would have; before its end
-- a renewal does not extend it.
local bound = nil
if live and f[3] and mode == 'claim' then
  bound = tonumber(f[13])
end
local decided, a, b
if bound and now >= bound then
  decided, a, b = 'held', bound, 'expired'
else
  decided, a, b = hold(now, lifetime, send_at, from, opens, closes)
end
if decided == 'stale' then
  return reply({'stale', tostring(now)})
end
if decided == 'held' then
  if b ~= 'expired' and not f[7] then
    emit('schedule/' .. gen, 'send_scheduled', cmsgpack.pack({gen = gen, group_id = f[6] or '', at_ms = a, reason = b}))
    put(gk .. 'at', a)
  end
  -- Only a claim gives a claim back: the worker claims after it read the
  -- provider's status, which tells a send that went out (its answer lost)
  -- from one that never started. A check comes before that read.
  if not live or mode ~= 'claim' then
    flush()
    return reply({'held', tostring(a), b, tostring(now), '0'})
  end
  local stopping = f[3] ~= false
  local unsent = stopping and num(f[9]) or 0
  emit('back/' .. gen .. '/' .. n, 'claim_given_back',
    cmsgpack.pack({gen = gen, n = n, at_ms = a, reason = b, stopped = stopping, unsent = unsent}))
  put(gk .. 'back', n)
  if not stopping then
    flush()
    return reply({'held', tostring(a), b, tostring(now), '1'})
  end
  stop_generation(gen, f[8], f[6], num(f[10]), num(f[11]))
  flush()
  redis.call('HINCRBY', STATE, 'stopped', 1)
  redis.call('HINCRBY', STATE, 'unsent', unsent)
  redis.call('HINCRBY', STATE, 'done', 1)
  redis.call('HINCRBY', STATE, 'sent_success', 0)
  redis.call('HINCRBY', STATE, 'sent_failed', 0)
  try_report()
  return reply({'cancelled', f[3]})
end
if mode ~= 'claim' then
  return reply({'free', tostring(now)})
end
if bound then
  a = math.min(a, bound)
end
if live then
  return reply({'claimed', claim_id, tostring(a), tostring(now), tostring(n), 'renewed'})
end
n = n + 1
local data = {gen = gen, until_ms = a}
if n > 1 then
  data.n = n
end
local id = emit(claim_key(n), 'send_claimed', cmsgpack.pack(data))
put(gk .. 'claimed', n)
put(gk .. 'until', a)
flush()
return reply({'claimed', id, tostring(a), tostring(now), tostring(n), 'new'})
