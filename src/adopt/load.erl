%% load.erl: the statements each expression starts with (erlang.rs puts them
%% at @LOAD@): compiles delayd_adopt.erl, sent as @SOURCE@ (base64), and
%% loads it as @MODULE@ (delayd_adopt_ and a hash of the source), unless a
%% node has it loaded already. A name per source means no load ever
%% replaces code another adopt run on the node is executing; the module
%% stays loaded (a few kilobytes) until the node restarts.
    case erlang:module_loaded(@MODULE@) of
        true -> ok;
        false ->
            AdoptToks = case erl_scan:string(binary_to_list(base64:decode(<<"@SOURCE@">>))) of
                            {ok, AdoptT, _} -> AdoptT
                        end,
            AdoptSplit = fun AdoptSplit([], [], Acc) -> lists:reverse(Acc);
                             AdoptSplit([{dot, _} = D | T], Cur, Acc) -> AdoptSplit(T, [], [lists:reverse([D | Cur]) | Acc]);
                             AdoptSplit([X | T], Cur, Acc) -> AdoptSplit(T, [X | Cur], Acc)
                         end,
            AdoptForms = [case erl_parse:parse_form(F) of {ok, Form} -> Form end
                          || F <- AdoptSplit(AdoptToks, [], [])],
            {ok, @MODULE@, AdoptBin} = compile:forms(AdoptForms, [binary]),
            {module, @MODULE@} = code:load_binary(@MODULE@, "delayd_adopt.erl", AdoptBin)
    end,
