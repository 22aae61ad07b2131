-- Prepended to every batch script (see src/store/scripts/mod.rs).
--
-- STATE is the batch's state hash (projection + idempotency keys), EVENTS
-- its event stream, BATCH the batch id (the keys and arguments are bound to
-- their declared names in front of every script: src/store/scripts/
-- declarations.rs). A script reads what it
-- needs with one HMGET, appends events with emit(), collects every state
-- change with put(), and writes them with one HSET in flush(): so appending
-- an event and updating the projection are one atomic step, in few commands.
local updates = {}
-- Types of the events appended, returned to the caller (for its metrics) as
-- the reply's element `ev=<type>,<type>...`; then, when something was
-- appended, `w=<key>|<entry id>` of the last event: the caller reads it back
-- once it is older than the fsync window, to detect writes Redis lost
-- (src/store/witness.rs).
local emitted = {}
local last_key, last_id

-- What put() wrote, by field, flushed or not: a script that reads a field
-- again after writing it (accept.lua, for the further chunks of one call)
-- reads it here instead of flushing and asking Redis.
local written = {}

local function put(field, value)
  local v = tostring(value)
  updates[#updates + 1] = field
  updates[#updates + 1] = v
  written[field] = v
end

local function num(x)
  return tonumber(x) or 0
end

-- Appends one event. Its idempotency key is recorded as `k:<key>` = entry id
-- (the caller checked it was absent). Every event but a stall refreshes the
-- batch's heartbeat `hb` (the entry id's milliseconds).
local function emit(key, etype, data, touch)
  local id = redis.call('XADD', EVENTS, '*', 'v', '1', 't', etype, 'k', key, 'd', data)
  put('k:' .. key, id)
  emitted[#emitted + 1] = etype
  last_key, last_id = key, id
  if touch ~= false then
    put('hb', string.match(id, '^(%d+)'))
  end
  return id
end

-- Writes what put() collected (and forgets it: a script may flush, read
-- what it wrote, and put more).
local function flush()
  if #updates > 0 then
    redis.call('HSET', STATE, unpack(updates))
    updates = {}
  end
end

-- A script's reply: its own fields, then what it appended.
local function reply(t)
  t[#t + 1] = 'ev=' .. table.concat(emitted, ',')
  if last_key then
    t[#t + 1] = 'w=' .. last_key .. '|' .. last_id
  end
  return t
end

-- Releases every chunk parked in `parked_key` for generation `gen` to
-- `work_key` as a load item into `group` ('' when the generation has none
-- and never will: each is recorded as given up), with the event that says
-- so, and deletes the parked hash. Returns how many were released.
local function release_parked(parked_key, work_key, gen, group)
  local parked = redis.call('HGETALL', parked_key)
  for i = 1, #parked, 2 do
    redis.call('XADD', work_key, '*', 'op', 'load',
      'd', cmsgpack.pack({batch = BATCH, gen = gen, seq = tonumber(parked[i]), group_id = group, attempt = 0}),
      'c', parked[i + 1])
  end
  local n = #parked / 2
  if n > 0 then
    emit('release/' .. gen, 'chunks_released', cmsgpack.pack({gen = gen, chunks = n}))
    redis.call('DEL', parked_key)
  end
  return n
end
