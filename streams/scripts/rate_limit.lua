-- Reserve provider requests from the shared rate limiter (GCRA). The caller
-- waits the returned number of milliseconds and then goes: one round trip per
-- request, no retry loop.
-- Keys: LIMITER[, OWED: when the lane is next owed a slot]
-- Arguments: RATE (requests per second), BURST, COST (requests), and optionally
-- MAX_WAIT, the longest wait (ms) worth reserving for, the lane's HORIZON (ms), the
-- lane's SHARE (requests per second) and AHEAD, how many slots to book ahead
-- (an empty string stands for an absent one)
-- Returns the wait in ms; a negative number -w when the wait would be longer
-- than allowed: nothing was reserved, come back in w ms. (A cost too large
-- to ever fit in that wait is reserved anyway, or it would never go.)
-- With slots to book ahead, returns {wait, n, within}: n more slots were
-- booked, either right after the cost's last one, `1 / rate` apart (within
-- 0), or, below the burst, to be used at once by `within` ms from now
-- (WINDOW; see below).
--
-- Priority lanes: every lane reserves on the one schedule, but a lane with
-- a horizon (normal, bulk) only reserves a slot that starts within its
-- horizon, so a more urgent lane (a longer horizon) always finds room ahead
-- of what lower lanes booked. A lane with a share is owed a slot every
-- 1/share seconds (its share key holds when, in µs): an owed request may
-- reserve up to the longest wait like the most urgent lane, so that a lower
-- lane keeps its share while higher lanes have work.
local rate, burst, cost = tonumber(RATE), tonumber(BURST), tonumber(COST)
local max_wait, horizon, share = tonumber(MAX_WAIT), tonumber(HORIZON), tonumber(SHARE)
local ahead, window = tonumber(AHEAD), tonumber(WINDOW)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = 1000000 / rate
local tat = tonumber(redis.call('GET', LIMITER)) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval * cost
local wait = new_tat - burst * interval - now
if wait < 0 then
  wait = 0
end
local limit = max_wait
-- When the lane is next owed a slot (µs; absent: now), read only when its
-- horizon alone would refuse.
local owed_at, owed = nil, false
if horizon and (not limit or horizon < limit) and wait > horizon * 1000 then
  if OWED and share and share > 0 then
    owed_at = tonumber(redis.call('GET', OWED)) or now
    owed = owed_at <= now
  end
  if not owed then
    limit = horizon
  end
end
if limit and wait > limit * 1000 and wait > (cost - burst) * interval then
  -- Back when the slot is due; a lane held back by its horizon comes back
  -- when the wait fits it, or when the lane is owed a slot.
  local back = wait
  if limit ~= max_wait then
    back = wait - limit * 1000
  end
  if owed_at and not owed and owed_at - now < back then
    back = owed_at - now
  end
  back = -math.max(1, math.ceil(back / 1000))
  if ahead then
    return {back, 0, 0}
  end
  return back
end
if owed then
  -- The lane's owed slot is taken: the next one is 1/share seconds after
  -- this one was due, so that a request that comes late (back from the
  -- delayed set) does not cost the lane its share; at most one slot late,
  -- so that an idle lane does not save up a burst.
  local next_owed = math.max(owed_at, now - 1000000 / share) + cost * 1000000 / share
  redis.call('SET', OWED, string.format('%.0f', next_owed), 'PX', math.ceil((next_owed - now) / 1000) + 1000)
end
-- Booking ahead: up to `ahead` more slots for the caller's next requests,
-- only when the schedule is already past the burst (each of them then
-- starts strictly later than the cost's last slot, after a wait the caller
-- can still use) and each within the lane's limit; never on an owed slot
-- (the share is taken request by request).
local booked, within = 0, 0
if ahead and ahead > 0 and not owed and new_tat - burst * interval - now >= 0 then
  booked = ahead
  if limit then
    booked = math.min(ahead, math.max(0, math.floor((limit * 1000 - wait) / interval)))
  end
  new_tat = new_tat + booked * interval
elseif ahead and ahead > 0 and not owed and window and window > 0 then
  -- Below the burst the caller's next requests could go at once, so slots
  -- spaced by the rate would mostly start before they are wanted and
  -- lapse. Instead, up to `ahead` slots that the caller may use at any
  -- time within the window, at once: they are charged as if they all went
  -- at its end (`at`), the latest they can go, and only as many as conform
  -- there without a wait. A token bucket never holds fewer tokens when its
  -- requests go earlier than charged, and the schedule seen by everyone
  -- else meanwhile already counts them, and the rest of the window as
  -- spent too: the provider still never sees more than the rate and burst
  -- allow.
  local at = now + window * 1000
  local from = math.max(new_tat, at)
  booked = math.min(ahead, math.max(0, math.floor((at + burst * interval - from) / interval + 1e-9)))
  if booked > 0 then
    new_tat = from + booked * interval
    within = window
  end
end
redis.call('SET', LIMITER, string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
if ahead then
  return {math.ceil(wait / 1000), booked, within}
end
return math.ceil(wait / 1000)
