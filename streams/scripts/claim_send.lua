-- Claim a generation's send, before the provider is asked to send it: the
-- claim and cancel.lua are linearized on the batch's state, so either the
-- cancel came first (the claim is refused and the group never sent) or the
-- claim did (the cancel leaves this generation alone: it is sent and
-- counted). The claim is kept: a worker that crashed after it claims again
-- and goes on with the send.
-- KEYS: state, events
-- ARGV: batch, gen
-- Returns {'claimed', entry id of the claim} or {'cancelled', reason}
local gen = tonumber(ARGV[2])
local f = redis.call('HMGET', STATE, 'k:claim/' .. gen, 'cancelled')
if f[1] then
  return reply({'claimed', f[1]})
end
if f[2] then
  return reply({'cancelled', f[2]})
end
local id = emit('claim/' .. gen, 'send_claimed', cmsgpack.pack({gen = gen}))
put('g:' .. gen .. ':claimed', 1)
flush()
return reply({'claimed', id})
