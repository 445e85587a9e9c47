--[[
What Allmende's two Slurm Lua plugins share: the configuration file and what a job asks the
admission API for. cli_filter.lua (in sbatch/salloc/srun, before slurmctld is contacted) asks the
API and carries the signed answer into the job; job_submit.lua (inside slurmctld, under its job
write lock) checks that answer against the job without asking anyone. Both must compute the very
same request from the same job, so they compute it here.

Loaded by both with dofile() from their own directory (next to slurm.conf): copy this file there
with them. Lua 5.1 (Debian's Slurm links liblua5.1); needs lua-cjson.
]]

local M = {}

M.NO_VAL = 4294967294
M.INFINITE = 4294967295
M.NO_VAL16 = 65534
M.TICKET_MARK = "allmende-ticket:"

M.DEFAULTS = {
  api_url = "http://127.0.0.1:8000",
  api_urls = nil,             -- every admission instance, tried in turn (default: { api_url })
  token = nil,                -- the scheduler token: the agent (and the hooks); never for users
  token_file = nil,
  submit_token = nil,         -- cli_filter's token: may only ask for admission (readable by users)
  submit_token_file = nil,
  ticket_key = nil,           -- the API's ALLMENDE_ADMISSION_TICKET_KEY (job_submit.lua only)
  ticket_key_file = nil,      -- ... from a file only SlurmUser reads (recommended)
  ticket_leeway_s = 30,       -- clock difference tolerated between the API and slurmctld
  privileged_uids = { 0 },    -- may release a held job or change an admitted one (root, SlurmUser)
  timeout_s = 2,
  fail_open = false,
  dry_run = false,
  id_field = "admin_comment", -- or "comment"
  clusters = {},              -- partition -> platform cluster (missing: the partition's name)
  default_partition = nil,    -- when the job names none and no partition is flagged Default
  projects = {},              -- account -> project (missing: the account's name)
  gpu_types = {},             -- Slurm GRES type -> platform GPU type (missing: the type as given)
  default_gpu_types = {},     -- platform cluster -> GPU type for an untyped --gres=gpu:N
  default_gpu_type = "H100",  -- ... when the cluster has none above
  priority_classes = { preemptible = "preemptible", normal = "standard", high = "non-preemptible" },
  default_priority_class = "standard",
  default_qos = "normal",     -- when neither the job nor the user's association names one
  preemptible_qos = "preemptible",
  interactive_qos = {},       -- QOS names whose jobs count as interactive (besides salloc/srun)
  default_hours = 1,          -- a job without a time limit (or an unlimited one) asks for this
  spool_dir = "/var/spool/slurm/allmende",
}

local ok_cjson, cjson = pcall(require, "cjson")
M.cjson = ok_cjson and cjson or nil

function M.is_null(v)
  return v == nil or (M.cjson ~= nil and v == M.cjson.null)
end

local function dirname(path)
  if path == nil then return nil end
  return path:match("^(.*)/[^/]*$")
end

function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local function first_line(path)
  local t = path and M.read_file(path)
  return t and (t:gsub("%s+$", "")) or nil
end

-- Where the config may be: $ALLMENDE_SLURM_CONFIG; allmende.json next to the plugin (slurm.conf's
-- directory); next to $SLURM_CONF; /etc/slurm/allmende.json.
function M.config_candidates(script_dir)
  local list = {}
  local env = os.getenv("ALLMENDE_SLURM_CONFIG")
  if env and env ~= "" then list[#list + 1] = env end
  if script_dir then list[#list + 1] = script_dir .. "/allmende.json" end
  local conf_dir = dirname(os.getenv("SLURM_CONF"))
  if conf_dir then list[#list + 1] = conf_dir .. "/allmende.json" end
  list[#list + 1] = "/etc/slurm/allmende.json"
  return list
end

local function with_defaults(data)
  local cfg = {}
  for k, v in pairs(M.DEFAULTS) do cfg[k] = v end
  for k, v in pairs(data or {}) do
    if not M.is_null(v) then cfg[k] = v end
  end
  if (cfg.token == nil or cfg.token == "") then cfg.token = first_line(cfg.token_file) end
  if (cfg.submit_token == nil or cfg.submit_token == "") then cfg.submit_token = first_line(cfg.submit_token_file) end
  if (cfg.ticket_key == nil or cfg.ticket_key == "") then cfg.ticket_key = first_line(cfg.ticket_key_file) end
  if type(cfg.api_urls) ~= "table" or #cfg.api_urls == 0 then cfg.api_urls = { cfg.api_url } end
  return cfg
end

local last_good = nil -- the last configuration read successfully (used while the file is unreadable)

-- The configuration and nil, or the last good one (else the defaults) and a sentence saying why
-- the file could not be read. Read at every call: edits apply at once.
function M.load_config(script_dir)
  if M.cjson == nil then
    return last_good or with_defaults(nil), "lua-cjson is not installed"
  end
  local tried = {}
  for _, path in ipairs(M.config_candidates(script_dir)) do
    local text = M.read_file(path)
    if text ~= nil then
      local ok, data = pcall(M.cjson.decode, text)
      if not ok or type(data) ~= "table" then
        return last_good or with_defaults(nil), string.format("%s is not valid JSON (%s)", path, tostring(data))
      end
      local cfg = with_defaults(data)
      cfg._path = path
      last_good = cfg
      return cfg, nil
    end
    tried[#tried + 1] = path
  end
  return last_good or with_defaults(nil), "no configuration file (tried " .. table.concat(tried, ", ") .. ")"
end

-- -- what a job asks for -----------------------------------------------------------------------

function M.unset(v)
  return v == nil or v == M.NO_VAL or v == M.INFINITE or v == M.NO_VAL16 or (type(v) == "number" and v < 0)
end

function M.first_of_list(s)
  if s == nil or s == "" then return nil end
  return (s:match("^([^,]+)"))
end

-- GPUs and type in one TRES request string such as "gres:gpu:h100:2", "gres:gpu:3",
-- "gres/gpu:h100=2", "gres:gpu" (1), possibly among other comma-separated entries.
function M.gpus_in(tres)
  if tres == nil or tres == "" then return 0, nil end
  local total, gpu_type = 0, nil
  for item in tres:gmatch("[^,]+") do
    local name = item:gsub("^gres[:/]", "")
    if name:match("^gpu") then
      local rest = name:sub(4)                 -- ":h100:2", ":2", ":h100=2", "=2", ""
      rest = rest:gsub("=", ":")
      local fields = {}
      for f in rest:gmatch("[^:]+") do fields[#fields + 1] = f end
      local count, kind = 1, nil
      if #fields >= 2 then
        kind, count = fields[1], tonumber(fields[#fields]) or 1
      elseif #fields == 1 then
        if tonumber(fields[1]) then count = tonumber(fields[1]) else kind = fields[1] end
      end
      total = total + count
      gpu_type = gpu_type or kind
    end
  end
  return total, gpu_type
end

local function contains(list, value)
  if type(list) ~= "table" or value == nil then return false end
  for _, v in ipairs(list) do
    if v == value then return true end
  end
  return false
end
M.contains = contains

-- Minutes as hours, truncated to 9 decimals ("0.116666666"): the API rounds hours x 3600 up to
-- whole seconds, which gives exactly minutes x 60 again (a float could give one second more).
function M.hours_of_minutes(minutes)
  local whole = math.floor(minutes / 60)
  local rest = minutes - whole * 60
  local frac = math.floor(rest * 1000000000 / 60)
  if frac == 0 then return string.format("%d", whole) end
  return string.format("%d.%09d", whole, frac)
end

function M.random_hex(bytes)
  local f = io.open("/dev/urandom", "rb")
  if f then
    local raw = f:read(bytes)
    f:close()
    if raw and #raw == bytes then
      return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end
  end
  local out = {}
  for i = 1, bytes do out[i] = string.format("%02x", math.random(0, 255)) end
  return table.concat(out)
end
math.randomseed(os.time() + math.floor((os.clock() * 1000000) % 1000000))

function M.sanitize(s)
  return (tostring(s):gsub("[^A-Za-z0-9._:@/+-]", "_"))
end

-- A new admission id: "slurm-<cluster>-<time>-<random>" (Slurm numbers a job only after
-- job_submit; the hooks publish its lifecycle under this id).
function M.new_job_id(cluster)
  return string.format("slurm-%s-%d-%s", M.sanitize(cluster), os.time(), M.random_hex(4))
end

--[[ The admission request of a job described by `facts`, each plugin's reading of its own input:
  account, partition, qos (nil: not given), gpus, slurm_type (nil: untyped), interactive (bool),
  time_minutes (nil or 0: no limit), user. Returns (body, extra) or nil for a job without GPUs;
  body.requested_seconds is what the API makes of body.requested_hours. ]]
function M.request(facts, cfg)
  if facts.gpus == nil or facts.gpus < 1 then return nil end
  local qos = facts.qos or cfg.default_qos
  local partition = facts.partition
  local cluster = (partition and cfg.clusters[partition]) or partition or "unknown"
  local gpu_type
  if facts.slurm_type then
    gpu_type = cfg.gpu_types[facts.slurm_type] or facts.slurm_type
  else
    gpu_type = cfg.default_gpu_types[cluster] or cfg.default_gpu_type
  end
  local hours, hours_note, seconds
  if facts.time_minutes == nil or facts.time_minutes == 0 then
    hours, hours_note = tostring(cfg.default_hours), "default"
    seconds = math.ceil(tonumber(cfg.default_hours) * 3600)
  else
    hours, seconds = M.hours_of_minutes(facts.time_minutes), facts.time_minutes * 60
  end
  local body = {
    job_id = M.new_job_id(cluster),
    project = (facts.account and cfg.projects[facts.account]) or facts.account or "unknown",
    user = facts.user,
    cluster = cluster,
    gpu_type = gpu_type,
    gpus = facts.gpus,
    priority_class = cfg.priority_classes[qos] or cfg.default_priority_class,
    interactive = facts.interactive or contains(cfg.interactive_qos, qos),
    requested_hours = hours,
  }
  return body, { qos = qos, account = facts.account, partition = partition, hours_note = hours_note,
                 requested_seconds = seconds }
end

-- One line for logs: "slurm-x-... (project p, cluster, 2 H100 GPUs, standard, 1 h)".
function M.label(body)
  return string.format("%s (project %s, %s, %d %s GPUs, %s, %s%s h)", body.job_id, body.project,
    body.cluster, body.gpus, body.gpu_type, body.priority_class,
    body.interactive and "interactive, " or "", body.requested_hours)
end

function M.hex_decode(hex)
  if hex:find("[^0-9a-fA-F]") or #hex % 2 ~= 0 then return nil end
  return (hex:gsub("..", function(h) return string.char(tonumber(h, 16)) end))
end

function M.hex_encode(raw)
  return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

return M
