-- Pointsman: the token usage of a model server's response, read as the body streams past.
--
-- Runs in Envoy's Lua filter after ext_proc in http_filters (so before it on the response path). It
-- reads every body chunk as it arrives (bodyChunks: nothing is buffered or held), keeps the text from
-- the last "usage" key on (at most KEPT bytes), and when the body ends sets the dynamic metadata
-- pointsman.usage {prompt_tokens, completion_tokens}. Envoy's gRPC access log carries it, with the
-- picker's own pointsman.route metadata, to the picker (docs/envoy.md, "Response side").
--
-- A JSON completion has "usage" in its one object; an SSE stream in its last event when the client
-- asked for it (stream_options.include_usage; earlier events may say "usage":null). The key or the
-- object may straddle two chunks: the last bytes of each chunk are searched again with the next.
-- One source: pointsman_devstack.envoy embeds this file into every bootstrap it renders; the
-- envoy-gateway overlay and the Helm chart ship copies for an EnvoyExtensionPolicy's lua (`make
-- chart-files`; a deploy test fails while a copy differs).

local KEY = '"usage"'
local OVERLAP = #KEY - 1 -- a key split across two chunks is found in the next one
local KEPT = 1024 -- bytes kept from the key on: OpenAI's usage object with its details is ~250

local function last_key(text)
  local at, from = nil, 1
  while true do
    local found = string.find(text, KEY, from, true)
    if found == nil then
      return at
    end
    at, from = found, found + #KEY
  end
end

function envoy_on_response(handle)
  local content_type = handle:headers():get("content-type") or ""
  if not (string.find(content_type, "json", 1, true) or string.find(content_type, "event-stream", 1, true)) then
    return
  end
  local usage = nil -- the text from the last key on, at most KEPT bytes
  local tail = ""
  for chunk in handle:bodyChunks() do
    local bytes = chunk:getBytes(0, chunk:length())
    local text = tail .. bytes
    local at = last_key(text)
    if at ~= nil then
      usage = string.sub(text, at, at + KEPT - 1)
    elseif usage ~= nil and #usage < KEPT then
      usage = usage .. string.sub(bytes, 1, KEPT - #usage)
    end
    tail = string.sub(text, -OVERLAP)
  end
  if usage == nil then
    return
  end
  local prompt = string.match(usage, '"prompt_tokens"%s*:%s*(%d+)')
  local completion = string.match(usage, '"completion_tokens"%s*:%s*(%d+)')
  if prompt == nil or completion == nil then
    return
  end
  local metadata = handle:streamInfo():dynamicMetadata()
  metadata:set("pointsman.usage", "prompt_tokens", tonumber(prompt))
  metadata:set("pointsman.usage", "completion_tokens", tonumber(completion))
end
