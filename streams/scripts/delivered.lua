-- Ends delivery tracking of a generation, then decides the batch's delivery
-- report when it was the last one the batch waited for.
--
-- The generation: its pages' counts (track_page.lua) are summed into
-- `generation_delivered` (key `delivered/<gen>`), once.
-- The batch: once it is reported and every generation the provider finished
-- (`g:<g>:done` COMPLETE or FAILED: the tracked ones) is delivered,
-- `batch_delivered` (key `delivery_report`) counts every accepted recipient
-- in exactly one outcome, once; it goes to the reports stream (field
-- `t` = `batch_delivered`) and, with a webhook, to a `delivery_report` work
-- item; the results and delivery hashes then live `--results-retention`.
-- Keys: STATE, EVENTS, WORK, REPORTS, RESULTS, DELIVERY
-- Arguments: BATCH, GEN ('': none, only the batch's decision: a batch with no
--       generation left to track, see settle.lua), GROUP (its id), WINDOW_ENDED
--       0|1, RETENTION (of the results) s, DELIVER 0|1
-- Returns {'delivered'|'duplicate', then the batch's: 'decided' (now),
--  'already', 'unreported' (no report yet) or 'tracking' (a generation's
--  results are still coming)}
local gen = tonumber(GEN)
local first = 'duplicate'
if gen and not redis.call('HGET', STATE, 'k:delivered/' .. gen) then
  first = 'delivered'
  local d, f, u, by = 0, 0, 0, {}
  local all = redis.call('HGETALL', DELIVERY)
  local prefix = gen .. '|'
  for i = 1, #all, 2 do
    local k = all[i]
    if string.sub(k, 1, #prefix) == prefix and k ~= prefix .. 'group' then
      local pd, pf, pu, codes = string.match(all[i + 1], '^(%d+)|(%d+)|(%d+)|(.*)$')
      d, f, u = d + tonumber(pd), f + tonumber(pf), u + tonumber(pu)
      for code, n in string.gmatch(codes, '([^,=]+)=(%d+)') do
        by[code] = (by[code] or 0) + tonumber(n)
      end
    end
  end
  local event = {gen = gen, group_id = GROUP, delivered = d, failed = f, unknown = u}
  -- cmsgpack packs an empty table as an array: the map only when it has keys.
  if next(by) then
    event.failed_by_code = by
  end
  if WINDOW_ENDED == '1' then
    event.window_ended = true
  end
  emit('delivered/' .. gen, 'generation_delivered', cmsgpack.pack(event))
  put('g:' .. gen .. ':dl', 1)
  flush()
  redis.call('HINCRBY', STATE, 'dl_delivered', d)
  redis.call('HINCRBY', STATE, 'dl_failed', f)
  redis.call('HINCRBY', STATE, 'dl_unknown', u)
  redis.call('HINCRBY', STATE, 'dl_gens', 1)
  for code, n in pairs(by) do
    redis.call('HINCRBY', STATE, 'dlc:' .. code, n)
  end
end

local f = redis.call('HMGET', STATE, 'k:delivery_report', 'report', 'gen')
if f[1] then
  return reply({first, 'already'})
end
if not f[2] then
  return reply({first, 'unreported'})
end
-- Every tracked generation delivered? Their registered recipients add up
-- the sent ones.
local tracked_reg = 0
for g = 0, tonumber(f[3]) or -1 do
  local gk = 'g:' .. g .. ':'
  local s = redis.call('HMGET', STATE, gk .. 'done', gk .. 'dl', gk .. 'reg')
  if s[1] == 'COMPLETE' or s[1] == 'FAILED' then
    if not s[2] then
      return reply({first, 'tracking'})
    end
    tracked_reg = tracked_reg + num(s[3])
  end
end
local t = {}
local all = redis.call('HGETALL', STATE)
for i = 1, #all, 2 do
  t[all[i]] = all[i + 1]
end
local given_up = num(t['fr:given_up'])
local by = {}
for k, v in pairs(t) do
  local code = string.match(k, '^fr:(.+)$') or string.match(k, '^dlc:(.+)$')
  if code and code ~= 'given_up' then
    by[code] = (by[code] or 0) + tonumber(v)
  end
end
local recipients, registered, failed = num(t.recipients), num(t.registered), num(t.failed)
local delivered, failed_delivery = num(t.dl_delivered), num(t.dl_failed)
local failed_registration = failed - given_up
-- Sent, without a result: whatever of the tracked generations' registered
-- recipients the list did not show final, and the generations whose
-- outcome could not be learned.
local unknown = math.max(0, tracked_reg - delivered - failed_delivery) + num(t.unknown)
-- A given-up add may in fact have registered some of its recipients
-- (`unsure`): the list then shows them final, beyond the registered count.
-- Those are counted by their result, not as given up, so that every
-- recipient has one outcome.
local surplus = math.max(0, delivered + failed_delivery - tracked_reg)
local report = {recipients = recipients + num(t.duplicates), delivered = delivered,
  failed = failed_registration + failed_delivery, failed_at_registration = failed_registration,
  failed_at_delivery = failed_delivery, unknown = unknown, duplicates = num(t.duplicates),
  not_sent = math.max(0, recipients - registered - failed) + num(t.unsent) + math.max(0, given_up - surplus)}
if next(by) then
  report.failed_by_code = by
end
if t.origin then
  report.origin = t.origin
end
local packed = cmsgpack.pack(report)
emit('delivery_report', 'batch_delivered', packed)
put('dl_report', 1)
flush()
redis.call('XADD', REPORTS, '*', 'batch', BATCH, 't', 'batch_delivered', 'd', packed)
if DELIVER == '1' then
  redis.call('XADD', WORK, '*', 'op', 'delivery_report', 'd', cmsgpack.pack({batch = BATCH, gen = 0, attempt = 0}))
end
local keep = tonumber(RETENTION)
if keep > 0 then
  redis.call('EXPIRE', RESULTS, keep)
  redis.call('EXPIRE', DELIVERY, keep)
end
return reply({first, 'decided'})
